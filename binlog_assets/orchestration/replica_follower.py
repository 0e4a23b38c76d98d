"""Replicas that follow the changelog as it lands: a follower run per replica build slot.

With `dagster.replica_follow_seconds` above 0, replicas are not built by automation
after each consumer run (a tick, a queue, a new process, a Spark session: 10-15 s before
the first row moved). One `follow_replicas_job` run instead keeps a Spark session and
applies every new changelog version within `replica_poll_seconds` of its commit, for
`replica_follow_seconds`; `replica_follower_sensor` starts the next one. Each apply that
changed a replica is reported as that replica's materialization at once, and the run
ends with each changed replica's `row_count_matches_changelog` check.

The follower holds the `spark` pool's slot, as a replica build does, so replica builds
never overlap; it hands the slot over early when another run waits for it (a rebuild
from the launchpad, or dbt on an embedded catalog).
"""

import time
from collections.abc import Callable, Iterator

import dagster as dg
from pydantic import Field

from binlog_assets.orchestration.replica_reports import (
    counted_rows,
    failure_line,
    replica_key,
    replica_metadata,
    replica_names,
    replica_table_metadata,
    replicas_failed,
    row_count_check,
)
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import EVERY_DAEMON_PASS, SPARK_POOL, UNFINISHED

FOLLOW_JOB_NAME = "follow_replicas_job"


class FollowConfig(dg.Config):
    seconds: float | None = Field(None, gt=0, description="how long this run follows the "
                                  "changelog (default: dagster.replica_follow_seconds)")


def follow(apply: Callable[[str, int], object], names: list[str],
           version: Callable[[], int], *, poll: float, stop: Callable[[], bool]
           ) -> Iterator[tuple[str, object]]:
    """Apply each new changelog version to every replica until `stop()` says so; yields
    (replica, result) for every apply. The first round applies whatever is pending. A
    replica whose apply fails is yielded with its error once and left for the rest of
    the run: the others go on following."""
    seen = None
    broken: set[str] = set()
    while True:
        current = version()
        if current != seen:
            for name in names:
                if name in broken:
                    continue
                try:
                    result = apply(name, current)
                except Exception as exc:  # noqa: BLE001 - the run reports it at its end
                    broken.add(name)
                    result = exc
                yield name, result
            seen = current
        if stop():
            return
        time.sleep(poll)


def changed(result) -> bool:
    """Whether an apply changed the replica (rows, schema, truncates, purged tombstones)."""
    return bool(result.rows or result.schema_changes or result.truncated
                or result.tombstones)


def pool_wanted(instance: dg.DagsterInstance, own_run_id: str) -> bool:
    """Whether another run waits for the `spark` pool: a step waiting for a slot, or a
    queued run whose first steps need one (the queue holds those back)."""
    info = instance.event_log_storage.get_concurrency_info(SPARK_POOL)
    if info.pending_run_ids - {own_run_id}:
        return True
    queued = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED]))
    return any(run.run_op_concurrency is not None
               and SPARK_POOL in run.run_op_concurrency.root_key_counts
               for run in queued if run.run_id != own_run_id)


@dg.op(name="follow_replicas", pool=SPARK_POOL, out={},
       description="Apply each new changelog version to the replicas as it lands.")
def follow_replicas(context: dg.OpExecutionContext, config: FollowConfig,
                    binlake: BinlakeResource) -> Iterator:
    from binlog_assets.lakehouse.changelog_reader import changelog_version
    from binlog_assets.lakehouse.replica import ReplicaBuilder

    pipeline = binlake.pipeline
    seconds = config.seconds or pipeline.dagster.replica_follow_seconds or 300.0
    builder = ReplicaBuilder(binlake.spark(), pipeline)
    deadline = time.monotonic() + seconds
    applied: dict[str, tuple[str | None, int]] = {}  # replica -> (key rule, version)

    def stop() -> bool:
        if time.monotonic() >= deadline:
            return True
        if pool_wanted(context.instance, context.run_id):
            context.log.info("another run waits for the spark pool: handing it over")
            return True
        return False

    names = replica_names(pipeline)
    failed: list[tuple[str, Exception]] = []
    for name, result in follow(lambda n, v: builder.apply(n, up_to_version=v), names,
                               lambda: changelog_version(builder.spark, pipeline),
                               poll=pipeline.dagster.replica_poll_seconds, stop=stop):
        if isinstance(result, Exception):
            failed.append((name, result))
            context.log.error(f"replica {name}: {type(result).__name__}: "
                              f"{failure_line(result)}; the others go on following")
        elif changed(result):
            applied[name] = (result.key_rule, result.applied_version)
            context.log.info(f"replica {name}: {result}")
            if result.warning:
                context.log.warning(result.warning)
            yield dg.AssetMaterialization(
                asset_key=replica_key(name),
                metadata=replica_metadata(result, None) | replica_table_metadata(builder, name))
    # Once per run and per changed replica: a check reads the whole changelog.
    for name, (rule, version) in sorted(applied.items()):
        result = row_count_check(builder, name, rule, counted_rows(builder, name, rule),
                                 version)
        yield dg.AssetCheckEvaluation(
            asset_key=result.asset_key, check_name=result.check_name, passed=result.passed,
            metadata=result.metadata, description=result.description)
    if failed:
        raise replicas_failed(failed, len(names))


@dg.job(name=FOLLOW_JOB_NAME, executor_def=dg.in_process_executor,
        description="Replicas follow the changelog for a while (dagster.replica_follow_seconds).")
def follow_replicas_job() -> None:
    follow_replicas()


@dg.sensor(
    name="replica_follower_sensor",
    job=follow_replicas_job,
    minimum_interval_seconds=EVERY_DAEMON_PASS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Keeps one follower run going when dagster.replica_follow_seconds > 0.",
)
def replica_follower_sensor(context: dg.SensorEvaluationContext, binlake: BinlakeResource
                            ) -> dg.RunRequest | dg.SkipReason:
    if not binlake.pipeline.dagster.replica_follow_seconds:
        return dg.SkipReason("dagster.replica_follow_seconds is 0: automation builds the "
                             "replicas after each consumer run")
    if context.instance.get_runs(filters=dg.RunsFilter(job_name=FOLLOW_JOB_NAME,
                                                       statuses=UNFINISHED), limit=1):
        return dg.SkipReason("a follower run is queued or running")
    return dg.RunRequest()
