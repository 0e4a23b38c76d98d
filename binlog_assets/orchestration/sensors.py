"""Sensors: discover Kafka topic-partitions, and launch bounded runs where lag builds up.

`kafka_partition_discovery_sensor` adds a dynamic partition for every partition of a
configured topic. `kafka_lag_sensor` measures lag (log end − the group's committed
offset) per known partition; a partition is due when its lag reaches
`dagster.lag_threshold`, or has waited longer than `dagster.max_staleness_seconds`. Due
partitions go into runs of at most `dagster.max_partitions_per_run` partitions: a run
covers a contiguous range of the dynamic partitions (Dagster runs ranges, not sets), so
a range may include idle partitions between due ones, which cost a checkpoint read each.
A partition that a queued or running consumer run holds is never requested again (one
owner per partition), and no range spans one. Its JSON cursor remembers since when
each partition has been lagging (ISO times); run keys carry each partition's checkpoint
and end offset, so one stretch is never requested twice, and a request Dagster would drop
for its key is named in the skip reason instead.
"""

import hashlib
import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime

import dagster as dg
from dagster._core.storage.tags import RUN_KEY_TAG, SENSOR_NAME_TAG

from binlog_assets.consume.lag import PartitionLag, measure_lag
from binlog_assets.orchestration.partitions import (
    CHANGELOG_ASSET_KEY,
    KAFKA_PARTITIONS_NAME,
    kafka_partitions_def,
    partition_key,
)
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import (
    CONSUME_JOB_NAME,
    EVERY_DAEMON_PASS,
    LAG_TAG,
    PARTITION_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
    REASON_TAG,
    UNFINISHED,
)

LAG_SENSOR_NAME = "kafka_lag_sensor"


def _configured_topics(binlake: BinlakeResource) -> list[str]:
    return [t for s in binlake.pipeline.sources for t in s.topics]


@dg.sensor(
    name="kafka_partition_discovery_sensor",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Adds a partition for every partition of the configured Kafka topics.",
)
def kafka_partition_discovery_sensor(
    context: dg.SensorEvaluationContext, binlake: BinlakeResource
) -> dg.SensorResult | dg.SkipReason:
    from confluent_kafka import Consumer

    from binlog_assets.consume.lag import topic_partitions
    from binlog_assets.consume.preflight import check_cluster

    check_cluster(binlake.kafka_conf())
    consumer = Consumer({**binlake.kafka_conf(), "group.id": "binlake-discovery"})
    try:
        found = [partition_key(t, p) for t, p in
                 topic_partitions(consumer, _configured_topics(binlake))]
    finally:
        consumer.close()
    known = set(context.instance.get_dynamic_partitions(KAFKA_PARTITIONS_NAME))
    new = sorted(set(found) - known)
    cursor = json.dumps({"partitions": len(known) + len(new)})
    if not new:
        return dg.SkipReason(f"no new topic-partitions ({len(known)} known)")
    context.log.info(f"discovered {len(new)} topic-partitions: {new}")
    return dg.SensorResult(
        dynamic_partitions_requests=[kafka_partitions_def.build_add_request(new)],
        cursor=cursor,
    )


def held_partitions(instance: dg.DagsterInstance, known: Sequence[str]) -> set[str]:
    """The partitions that queued or running consumer runs hold (a range run holds every
    partition of its range)."""
    index = {key: i for i, key in enumerate(known)}
    held: set[str] = set()
    for run in instance.get_runs(filters=dg.RunsFilter(job_name=CONSUME_JOB_NAME,
                                                       statuses=UNFINISHED)):
        tags = run.tags
        if PARTITION_TAG in tags:
            held.add(tags[PARTITION_TAG])
        elif tags.get(RANGE_START_TAG) in index and tags.get(RANGE_END_TAG) in index:
            held.update(known[index[tags[RANGE_START_TAG]]:index[tags[RANGE_END_TAG]] + 1])
    return held


def changelog_backfill_in_progress(instance: dg.DagsterInstance) -> str | None:
    """The id of an unfinished backfill of the changelog (asset or job backfill), if any.

    Its runs are created as it goes, so which partitions it will hold is not known from
    the runs yet: the lag sensor waits for it rather than race it for a partition.
    """
    from dagster._core.execution.backfill import BulkActionStatus
    from dagster._core.remote_representation.external_data import (
        job_name_for_partition_set_snap_name,
    )

    for backfill in instance.get_backfills(status=BulkActionStatus.REQUESTED):
        if backfill.asset_selection and CHANGELOG_ASSET_KEY in backfill.asset_selection:
            return backfill.backfill_id
        origin = backfill.partition_set_origin
        if origin is not None and job_name_for_partition_set_snap_name(
                origin.partition_set_name) == CONSUME_JOB_NAME:
            return backfill.backfill_id
    return None


def plan_batches(known: Sequence[str], due: Sequence[str], held: set[str],
                 max_per_run: int) -> list[list[str]]:
    """Contiguous ranges of `known` (in its order), at most `max_per_run` long, covering
    every due partition that is not held, spanning no held partition, and starting and
    ending on due ones."""
    due_set = set(due) - held
    batches: list[list[str]] = []
    current: list[str] = []  # starts on a due partition; may end in idle ones

    def close() -> None:
        while current and current[-1] not in due_set:
            current.pop()
        if current:
            batches.append(list(current))
        current.clear()

    for key in known:
        if key in held:
            close()
        elif current:
            if len(current) == max_per_run:
                close()
                if key in due_set:
                    current.append(key)
            else:
                current.append(key)
        elif key in due_set:
            current.append(key)
    close()
    return batches


def lagging_since_seconds(value: str | float) -> float:
    """A cursor's `lagging_since` entry as epoch seconds: ISO 8601 text (what the cursor
    stores, readable in the UI) or the epoch seconds older cursors stored."""
    if isinstance(value, int | float):
        return float(value)
    return datetime.fromisoformat(value).timestamp()


def readable_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def batch_request(batch: Sequence[str], lags: dict[str, PartitionLag],
                  by_threshold: set[str]) -> dg.RunRequest:
    """The run of one batch: a single partition as itself, a longer one as a range. Its
    run key names each partition's checkpoint and end offset, so the same stretch of a
    partition is never requested twice, and tags say why the run was requested."""
    def span(key: str) -> str:
        pl = lags.get(key)
        return f"{key}@{pl.checkpoint}-{pl.high}" if pl else f"{key}@-"

    ends = ",".join(span(key) for key in batch)
    tags = {REASON_TAG: "lag_threshold" if by_threshold.intersection(batch) else "staleness",
            LAG_TAG: str(sum(lags[k].lag for k in batch if k in lags))}
    if len(batch) == 1:
        return dg.RunRequest(run_key=ends, partition_key=batch[0], tags=tags)
    digest = hashlib.sha1(ends.encode()).hexdigest()[:16]
    return dg.RunRequest(
        run_key=f"{batch[0]}..{batch[-1]}#{digest}",
        tags={**tags, RANGE_START_TAG: batch[0], RANGE_END_TAG: batch[-1]},
    )


def earlier_run(instance: dg.DagsterInstance, run_key: str) -> dg.DagsterRun | None:
    """The run this sensor already launched under `run_key`: Dagster drops a request
    whose key was used before without a word, so the sensor says so itself."""
    runs = instance.get_runs(filters=dg.RunsFilter(tags={
        RUN_KEY_TAG: run_key, SENSOR_NAME_TAG: LAG_SENSOR_NAME}), limit=1)
    return runs[0] if runs else None


@dg.sensor(
    name=LAG_SENSOR_NAME,
    job_name=CONSUME_JOB_NAME,
    minimum_interval_seconds=EVERY_DAEMON_PASS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Requests bounded consumer runs for topic-partitions whose lag reached "
                "dagster.lag_threshold or that lagged longer than "
                "dagster.max_staleness_seconds, up to dagster.max_partitions_per_run "
                "partitions per run; each request's tags say why (binlake/reason).",
)
def kafka_lag_sensor(
    context: dg.SensorEvaluationContext, binlake: BinlakeResource
) -> dg.SensorResult | dg.SkipReason:
    pipeline = binlake.pipeline
    if pipeline.dagster.changelog_follow_seconds:
        return dg.SkipReason("dagster.changelog_follow_seconds > 0: a changelog follower "
                             "run consumes the partitions as records arrive")
    state = json.loads(context.cursor) if context.cursor else {}
    lagging_since = {k: lagging_since_seconds(v)
                     for k, v in state.get("lagging_since", {}).items()}
    known = context.instance.get_dynamic_partitions(KAFKA_PARTITIONS_NAME)
    known_set = set(known)
    now = time.time()
    due: list[str] = []
    by_threshold: set[str] = set()
    lags: dict[str, PartitionLag] = {}
    still_lagging: dict[str, float] = {}
    total = 0
    for pl in measure_lag(binlake.kafka_conf(), binlake.group_id(), _configured_topics(binlake)):
        key = partition_key(pl.topic, pl.partition)
        lags[key] = pl
        if key not in known_set or pl.lag == 0:
            continue
        total += pl.lag
        since = lagging_since.get(key, now)
        still_lagging[key] = since
        if pl.lag >= pipeline.dagster.lag_threshold:
            by_threshold.add(key)
            due.append(key)
        elif now - since >= pipeline.dagster.max_staleness_seconds:
            due.append(key)
    cursor = json.dumps({"lagging_since": {k: readable_time(v)
                                           for k, v in still_lagging.items()}},
                        sort_keys=True)
    backfill = changelog_backfill_in_progress(context.instance) if due else None
    if backfill is not None:
        return dg.SensorResult(skip_reason=dg.SkipReason(
            f"{len(due)} partitions are due; waiting for backfill {backfill} of the "
            f"changelog to finish (its runs own their partitions)"), cursor=cursor)
    held = held_partitions(context.instance, known) if due else set()
    batches = plan_batches(known, due, held, pipeline.dagster.max_partitions_per_run)
    requests, taken = [], []
    for batch in batches:
        request = batch_request(batch, lags, by_threshold)
        run = earlier_run(context.instance, request.run_key)
        if run is None:
            requests.append(request)
        else:
            taken.append(f"{request.run_key} was already requested: run {run.run_id[:8]} "
                         f"{run.status.value}")
    if taken:
        context.log.info("; ".join(taken))
    if requests:
        return dg.SensorResult(run_requests=requests, cursor=cursor)
    if taken:
        reason = (f"{len(taken)} due batches were already requested with the same "
                  f"checkpoints and end offsets; waiting for new records or a re-execution "
                  f"of that run: " + "; ".join(taken[:5]))
    elif due:
        reason = (f"{len(due)} partitions are due, but runs in flight hold them: "
                  f"{sorted(held & set(due))[:10]}")
    elif still_lagging:
        reason = (f"{len(still_lagging)} partitions lag {total} records in all, under "
                  f"lag_threshold={pipeline.dagster.lag_threshold} and not yet stale (oldest "
                  f"since {readable_time(min(still_lagging.values()))}, stale after "
                  f"{pipeline.dagster.max_staleness_seconds} s)")
    else:
        reason = "no lag on any known partition"
    return dg.SensorResult(skip_reason=dg.SkipReason(reason), cursor=cursor)


binlake_automation_sensor = dg.AutomationConditionSensorDefinition(
    "binlake_automation_sensor",
    target=dg.AssetSelection.all(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=EVERY_DAEMON_PASS,
    description="Replicas follow new changelog data.",
)
