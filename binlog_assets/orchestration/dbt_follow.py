"""`dbt_follow_sensor`: the dbt models follow the replicas. When a replica changed since
the last build, it launches one `dbt_build_job` run of the models downstream of the
replicas that changed (dbt tests of those models included, as asset checks; models they
read that were never built join them; a model over a replica never built waits): at once
when the last build was launched `dagster.dbt_follow_seconds` or more ago, else when
that interval is up; never while a build is queued or running.

With Spark in each run's process, dbt and replica builds share one Spark slot (the
`spark` pool of the embedded catalog): the interval bounds how often dbt takes it from
the replicas. Over Spark Connect dbt takes no slot.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Set

import dagster as dg

from binlog_assets.orchestration.parity_checks import failed_parity, parity_held_message
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import (
    DBT_JOB_NAME,
    EVERY_DAEMON_PASS,
    IN_SYNC_TAG,
    UNFINISHED,
)

ModelDeps = Mapping[dg.AssetKey, Set[dg.AssetKey]]


def downstream_models(models: ModelDeps, changed: Set[dg.AssetKey]) -> list[dg.AssetKey]:
    """The models (each key with the keys it reads) that read a changed key, directly or
    through another model."""
    reached, picked = set(changed), set()
    grew = True
    while grew:
        grew = False
        for key, upstream in models.items():
            if key not in picked and upstream & reached:
                picked.add(key)
                reached.add(key)
                grew = True
    return sorted(picked, key=lambda k: k.to_user_string())


def upstream(models: ModelDeps, key: dg.AssetKey) -> set[dg.AssetKey]:
    """Every key `key` reads, directly or through another model."""
    found: set[dg.AssetKey] = set()
    todo = list(models.get(key, ()))
    while todo:
        k = todo.pop()
        if k not in found:
            found.add(k)
            todo.extend(models.get(k, ()))
    return found


def models_to_build(models: ModelDeps, changed: Set[dg.AssetKey],
                    materialized: Set[dg.AssetKey]) -> list[dg.AssetKey]:
    """The models downstream of the `changed` replicas, with the models they read that
    were never built; a model over a replica never built waits for it."""
    picked = set(downstream_models(models, changed))
    for key in list(picked):
        picked |= {k for k in upstream(models, key) if k in models and k not in materialized}
    ready = [k for k in picked
             if all(u in materialized for u in upstream(models, k) if u not in models)]
    return sorted(ready, key=lambda k: k.to_user_string())


def changed_replicas(instance: dg.DagsterInstance, replicas: list[str], after: int
                     ) -> tuple[dict[dg.AssetKey, int], int]:
    """The replicas whose data changed after storage id `after` (a follower's "in sync"
    report changes none), with their latest change, and the latest storage id seen."""
    keys = [dg.AssetKey(["replica", name]) for name in replicas]
    changed: dict[dg.AssetKey, int] = {}
    latest = after
    for record in instance.get_asset_records(keys):
        last = record.asset_entry.last_materialization_record
        if last is None or last.storage_id <= after:
            continue  # one read of every replica's latest event: a quiet tick costs that
        latest = max(latest, last.storage_id)
        recent = instance.fetch_materializations(record.asset_entry.asset_key, limit=50).records
        data = [r.storage_id for r in recent if r.storage_id > after
                and IN_SYNC_TAG not in (r.event_log_entry.tags or {})]
        if data:
            changed[record.asset_entry.asset_key] = max(data)
    return changed, latest


def _cursor(text: str | None) -> tuple[int, float]:
    """(storage id built up to, when that build was launched); a plain id is an older
    cursor's."""
    if not text:
        return 0, 0.0
    if text.isdigit():
        return int(text), 0.0
    built = json.loads(text)
    return int(built["built"]), float(built["at"])


def dbt_follow_sensor(models: ModelDeps) -> dg.SensorDefinition:
    """The sensor over the dbt `models` (from the dbt assets' `asset_deps`)."""

    @dg.sensor(
        name="dbt_follow_sensor",
        job_name=DBT_JOB_NAME,
        minimum_interval_seconds=EVERY_DAEMON_PASS,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Builds the dbt models downstream of the replicas that changed, in one "
                    "run, as soon as one changes and at most once per "
                    "dagster.dbt_follow_seconds.",
    )
    def follow(context: dg.SensorEvaluationContext, binlake: BinlakeResource
               ) -> dg.SensorResult | dg.SkipReason:
        pipeline = binlake.pipeline
        built, launched = _cursor(context.cursor)
        replicas = sorted({t.replica for s in pipeline.sources for t in s.tables})
        changed, latest = changed_replicas(context.instance, replicas, built)
        if not changed:
            if latest > built:  # only "in sync" reports: nothing for dbt
                return dg.SensorResult(cursor=json.dumps({"built": latest, "at": launched}))
            return dg.SkipReason("no replica changed since the last dbt build")
        wait = launched + pipeline.dagster.dbt_follow_seconds - time.time()
        if wait > 0:
            return dg.SkipReason(f"replicas changed; the next dbt build in {wait:.0f} s "
                                 f"(dagster.dbt_follow_seconds)")
        if context.instance.get_runs(filters=dg.RunsFilter(job_name=DBT_JOB_NAME,
                                                           statuses=UNFINISHED), limit=1):
            return dg.SkipReason("a dbt build is queued or running; the next tick follows up")
        # The cursor stays: the build follows once the replicas check equal again.
        if pipeline.parity.block_dbt and (failed := failed_parity(context.instance, pipeline)):
            return dg.SkipReason(parity_held_message(failed))
        keys = {*models, *(u for deps in models.values() for u in deps)}
        built_keys = {r.asset_entry.asset_key
                      for r in context.instance.get_asset_records(list(keys))
                      if r.asset_entry.last_materialization_record is not None}
        selected = models_to_build(models, set(changed), built_keys)
        cursor = json.dumps({"built": latest, "at": time.time() if selected else launched})
        if not selected:
            return dg.SensorResult(cursor=cursor)  # no model reads those replicas
        return dg.SensorResult(
            run_requests=[dg.RunRequest(run_key=f"replicas@{max(changed.values())}",
                                        asset_selection=selected)],
            cursor=cursor)

    return follow
