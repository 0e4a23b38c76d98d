"""Sensors: discover Kafka topic-partitions, and launch bounded runs where lag builds up.

`kafka_partition_discovery_sensor` adds a dynamic partition for every partition of a
configured topic. `kafka_lag_sensor` measures lag (log end − the group's committed
offset) per known partition and requests one bounded consumer run per partition whose
lag reaches `dagster.lag_threshold`, or whose lag has waited longer than
`dagster.max_staleness_seconds`. Its JSON cursor remembers since when each partition
has been lagging; run keys carry the end offset, so one end is never requested twice.
"""

import json
import time

import dagster as dg

from binlog_assets.consume.lag import measure_lag
from binlog_assets.orchestration.partitions import (
    KAFKA_PARTITIONS_NAME,
    kafka_partitions_def,
    partition_key,
)
from binlog_assets.orchestration.resources import BinlakeResource

CONSUME_JOB_NAME = "consume_changelog_job"


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


@dg.sensor(
    name="kafka_lag_sensor",
    job_name=CONSUME_JOB_NAME,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Requests a bounded consumer run per topic-partition with enough lag.",
)
def kafka_lag_sensor(
    context: dg.SensorEvaluationContext, binlake: BinlakeResource
) -> dg.SensorResult | dg.SkipReason:
    cfg = binlake.pipeline
    state = json.loads(context.cursor) if context.cursor else {}
    lagging_since: dict[str, float] = state.get("lagging_since", {})
    known = set(context.instance.get_dynamic_partitions(KAFKA_PARTITIONS_NAME))
    now = time.time()
    requests: list[dg.RunRequest] = []
    still_lagging: dict[str, float] = {}
    total = 0
    for pl in measure_lag(binlake.kafka_conf(), group_id(binlake), _configured_topics(binlake)):
        key = partition_key(pl.topic, pl.partition)
        if key not in known or pl.lag == 0:
            continue
        total += pl.lag
        since = lagging_since.get(key, now)
        still_lagging[key] = since
        stale = now - since >= cfg.dagster.max_staleness_seconds
        if pl.lag >= cfg.dagster.lag_threshold or stale:
            requests.append(dg.RunRequest(
                run_key=f"{key}@{pl.high}",
                partition_key=key,
            ))
    cursor = json.dumps({"lagging_since": still_lagging}, sort_keys=True)
    if not requests:
        reason = (f"{len(still_lagging)} partitions lag {total} records in all, under "
                  f"lag_threshold={cfg.dagster.lag_threshold} and not yet stale"
                  if still_lagging else "no lag on any known partition")
        return dg.SensorResult(skip_reason=dg.SkipReason(reason), cursor=cursor)
    return dg.SensorResult(run_requests=requests, cursor=cursor)


binlake_automation_sensor = dg.AutomationConditionSensorDefinition(
    "binlake_automation_sensor",
    target=dg.AssetSelection.all(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=15,
    description="Replicas follow new changelog data; dbt models follow the replicas.",
)


def group_id(binlake: BinlakeResource) -> str:
    return str(binlake.pipeline.kafka.get("group.id", "binlake"))
