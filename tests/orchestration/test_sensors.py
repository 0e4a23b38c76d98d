"""Each sensor cursor transition, built with dg.build_sensor_context on the real broker."""

import json
import time
import uuid
from datetime import datetime
from pathlib import Path

import dagster as dg
import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from dagster._core.storage.tags import RUN_KEY_TAG, SENSOR_NAME_TAG

from binlog_assets.config import PipelineConfig
from binlog_assets.dev.kafka import create_topic
from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME, partition_key
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.sensors import (
    kafka_lag_sensor,
    kafka_partition_discovery_sensor,
    plan_batches,
)
from binlog_assets.orchestration.shared import (
    CONSUME_JOB_NAME,
    LAG_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
    REASON_TAG,
)


@pytest.fixture
def topic_config(pipeline_config: PipelineConfig, tmp_path: Path):
    """A config whose only source is a fresh 2-partition topic, and that topic's name."""
    topic = create_topic(pipeline_config.bootstrap_servers, "sensor", partitions=2)
    data = pipeline_config.model_dump(mode="json", exclude_none=True)
    data["kafka"]["group.id"] = f"g-{uuid.uuid4().hex[:6]}"
    data["sources"] = [{"name": "s", "topics": [topic], "format": "debezium",
                        "tables": [{"source": "d.orders", "replica": "orders"}]}]
    data["dagster"] = {"lag_threshold": 3, "max_staleness_seconds": 3600}
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(data))
    return topic, BinlakeResource(config_path=str(path)), data["kafka"]


def produce(bootstrap: str, topic: str, partition: int, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        p.produce(topic, partition=partition, value=b"{}", key=str(i).encode())
    assert p.flush(10) == 0


def test_discovery_adds_new_partitions_then_skips(topic_config) -> None:
    topic, binlake, kafka = topic_config
    with dg.instance_for_test() as instance:
        ctx = dg.build_sensor_context(instance=instance, resources={"binlake": binlake})
        result = kafka_partition_discovery_sensor(ctx)
        assert isinstance(result, dg.SensorResult)
        (req,) = result.dynamic_partitions_requests
        assert sorted(req.partition_keys) == [partition_key(topic, 0), partition_key(topic, 1)]
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, list(req.partition_keys))

        again = kafka_partition_discovery_sensor(
            dg.build_sensor_context(instance=instance, resources={"binlake": binlake},
                                    cursor=result.cursor))
        assert isinstance(again, dg.SkipReason)

        # A partition added to the topic is discovered on the next tick.
        admin = AdminClient({"bootstrap.servers": kafka["bootstrap.servers"]})
        for f in admin.create_partitions([NewPartitions(topic, 3)]).values():
            f.result()
        grown = kafka_partition_discovery_sensor(
            dg.build_sensor_context(instance=instance, resources={"binlake": binlake},
                                    cursor=result.cursor))
        assert isinstance(grown, dg.SensorResult)
        assert list(grown.dynamic_partitions_requests[0].partition_keys) == [
            partition_key(topic, 2)]


def test_lag_sensor_transitions(topic_config) -> None:
    topic, binlake, kafka = topic_config
    bootstrap = kafka["bootstrap.servers"]
    keys = [partition_key(topic, 0), partition_key(topic, 1)]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, keys)

        def tick(cursor: str | None) -> dg.SensorResult:
            return kafka_lag_sensor(dg.build_sensor_context(
                instance=instance, resources={"binlake": binlake}, cursor=cursor))

        # No lag: skip, with a reason.
        r0 = tick(None)
        assert not r0.run_requests and "no lag" in r0.skip_reason.skip_message

        # Lag under the threshold: skip, but the cursor remembers since when it lags.
        produce(bootstrap, topic, 0, 2)
        r1 = tick(r0.cursor)
        assert not r1.run_requests and "under lag_threshold=3" in r1.skip_reason.skip_message
        assert list(json.loads(r1.cursor)["lagging_since"]) == [keys[0]]

        # Lag at the threshold on partition 0 only: exactly one request, for that partition.
        produce(bootstrap, topic, 0, 1)
        r2 = tick(r1.cursor)
        assert [(r.partition_key, r.run_key) for r in r2.run_requests] == [(keys[0],
                                                                            f"{keys[0]}@0-3")]
        # The request says why it was made, and by how much the partition lagged.
        assert r2.run_requests[0].tags[REASON_TAG] == "lag_threshold"
        assert r2.run_requests[0].tags[LAG_TAG] == "3"
        # lagging_since survives the request (the run has not caught up yet), readable.
        assert json.loads(r2.cursor)["lagging_since"] == json.loads(r1.cursor)["lagging_since"]
        since = json.loads(r2.cursor)["lagging_since"][keys[0]]
        assert abs(datetime.fromisoformat(since).timestamp() - time.time()) < 60

        # That request's run ended without moving the checkpoint (it failed): the same
        # stretch is not requested again, and the skip reason says so rather than nothing.
        instance.add_run(dg.DagsterRun(
            job_name=CONSUME_JOB_NAME, run_id=uuid.uuid4().hex,
            status=dg.DagsterRunStatus.FAILURE,
            tags={**r2.run_requests[0].tags, RUN_KEY_TAG: r2.run_requests[0].run_key,
                  SENSOR_NAME_TAG: "kafka_lag_sensor"}))
        again = tick(r2.cursor)
        assert not again.run_requests
        assert f"{keys[0]}@0-3 was already requested" in again.skip_reason.skip_message
        assert "failure" in again.skip_reason.skip_message.lower()

        # Both partitions lag: one run for both, as a range of the dynamic partitions.
        produce(bootstrap, topic, 1, 5)
        r3 = tick(r2.cursor)
        (both,) = r3.run_requests
        assert both.partition_key is None
        assert (both.tags[RANGE_START_TAG], both.tags[RANGE_END_TAG]) == tuple(keys)
        assert (both.tags[REASON_TAG], both.tags[LAG_TAG]) == ("lag_threshold", "8")

        # While that run is running, it holds both partitions: nothing is requested again.
        instance.add_run(dg.DagsterRun(job_name=CONSUME_JOB_NAME, run_id=uuid.uuid4().hex,
                                       status=dg.DagsterRunStatus.STARTED, tags=both.tags))
        held = tick(r3.cursor)
        assert not held.run_requests
        assert "runs in flight hold them" in held.skip_reason.skip_message
        for run in instance.get_runs():
            instance.report_run_canceled(run)

        # The group commits partition 0's end: only partition 1 lags now.
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": kafka["group.id"]})
        c.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
        c.close()
        r4 = tick(r3.cursor)
        assert [r.partition_key for r in r4.run_requests] == [keys[1]]
        assert list(json.loads(r4.cursor)["lagging_since"]) == [keys[1]]


def test_lag_sensor_waits_while_a_backfill_of_the_changelog_runs(topic_config) -> None:
    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill

    topic, binlake, kafka = topic_config
    key = partition_key(topic, 0)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, [key])
        produce(kafka["bootstrap.servers"], topic, 0, 5)
        backfill = PartitionBackfill(
            "bf1", status=BulkActionStatus.REQUESTED, from_failure=False, tags={},
            backfill_timestamp=time.time(), asset_selection=[dg.AssetKey("changelog")])
        instance.add_backfill(backfill)

        def tick() -> dg.SensorResult:
            return kafka_lag_sensor(dg.build_sensor_context(
                instance=instance, resources={"binlake": binlake}))

        waiting = tick()
        assert not waiting.run_requests
        assert "waiting for backfill bf1" in waiting.skip_reason.skip_message
        instance.update_backfill(backfill.with_status(BulkActionStatus.COMPLETED))
        assert [r.partition_key for r in tick().run_requests] == [key]


def test_lag_sensor_requests_stale_lag_under_the_threshold(topic_config) -> None:
    topic, binlake, kafka = topic_config
    key = partition_key(topic, 0)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, [key])
        produce(kafka["bootstrap.servers"], topic, 0, 1)
        old = json.dumps({"lagging_since": {key: 0.0}})  # lagging since the epoch
        r = kafka_lag_sensor(dg.build_sensor_context(
            instance=instance, resources={"binlake": binlake}, cursor=old))
        assert [x.partition_key for x in r.run_requests] == [key]
        assert r.run_requests[0].tags[REASON_TAG] == "staleness"
        # The cursor keeps the old start, now as a readable time.
        assert json.loads(r.cursor)["lagging_since"] == {key: "1970-01-01T00:00:00+00:00"}


KEYS = [f"t:{i}" for i in range(8)]


def test_batches_are_ranges_of_due_partitions_at_most_max_long() -> None:
    # Idle partitions between due ones ride along; trailing idle ones do not.
    assert plan_batches(KEYS, ["t:1", "t:3", "t:4"], set(), 10) == [["t:1", "t:2", "t:3",
                                                                      "t:4"]]
    assert plan_batches(KEYS, KEYS, set(), 3) == [KEYS[0:3], KEYS[3:6], KEYS[6:8]]
    # A batch cut at the limit ends on its last due partition.
    assert plan_batches(KEYS, ["t:0", "t:4"], set(), 3) == [["t:0"], ["t:4"]]
    assert plan_batches(KEYS, [], set(), 3) == []


def test_batches_never_span_or_include_a_held_partition() -> None:
    assert plan_batches(KEYS, ["t:1", "t:2", "t:5"], {"t:3"}, 10) == [["t:1", "t:2"], ["t:5"]]
    assert plan_batches(KEYS, ["t:1", "t:2"], {"t:1"}, 10) == [["t:2"]]
    assert plan_batches(KEYS, ["t:0"], {"t:0"}, 10) == []


def test_dbt_follows_replica_changes_in_one_run_at_a_time(topic_config) -> None:
    from binlog_assets.orchestration.dbt_follow import dbt_follow_sensor
    from binlog_assets.orchestration.shared import DBT_JOB_NAME

    _topic, binlake, _kafka = topic_config
    orders = dg.AssetKey(["replica", "orders"])
    models = {dg.AssetKey("stg_orders"): {orders},
              dg.AssetKey("stg_customers"): {dg.AssetKey(["replica", "customers"])},
              dg.AssetKey("revenue"): {dg.AssetKey("stg_orders"), dg.AssetKey("stg_customers")}}
    sensor = dbt_follow_sensor(models)
    with dg.instance_for_test() as instance:
        def tick(cursor: str | None):
            return sensor(dg.build_sensor_context(
                instance=instance, resources={"binlake": binlake}, cursor=cursor))

        assert isinstance(tick(None), dg.SkipReason)  # no replica built yet
        instance.report_runless_asset_event(dg.AssetMaterialization(orders))
        first = tick(None)
        (request,) = first.run_requests
        # What reads orders and nothing never built: revenue waits for customers.
        assert request.asset_selection == [dg.AssetKey("stg_orders")]
        # Nothing new since: skip.
        assert isinstance(tick(first.cursor), dg.SkipReason)
        # A change within dagster.dbt_follow_seconds (300) of the last launch waits for it.
        instance.report_runless_asset_event(dg.AssetMaterialization(orders))
        soon = tick(first.cursor)
        assert isinstance(soon, dg.SkipReason) and "next dbt build in" in soon.skip_message
        # Past the interval, a build in flight still holds the next one back.
        past = json.dumps({**json.loads(first.cursor), "at": time.time() - 301})
        instance.add_run(dg.DagsterRun(job_name=DBT_JOB_NAME, run_id=uuid.uuid4().hex,
                                       status=dg.DagsterRunStatus.STARTED))
        busy = tick(past)
        assert isinstance(busy, dg.SkipReason) and "queued or running" in busy.skip_message
        for run in instance.get_runs():
            instance.report_run_canceled(run)
        (again,) = tick(past).run_requests
        assert again.run_key != request.run_key


def test_a_build_takes_never_built_models_it_reads_and_waits_for_missing_replicas() -> None:
    from binlog_assets.orchestration.dbt_follow import models_to_build

    orders, customers = dg.AssetKey(["replica", "orders"]), dg.AssetKey(["replica", "customers"])
    stg_o, stg_c, mart = dg.AssetKey("stg_orders"), dg.AssetKey("stg_customers"), dg.AssetKey("m")
    models = {stg_o: {orders}, stg_c: {customers}, mart: {stg_o, stg_c}}
    # customers was never built: stg_customers and the mart over it wait.
    assert models_to_build(models, {orders}, {orders}) == [stg_o]
    # Both replicas built, the staging models never: the mart's build takes them.
    assert models_to_build(models, {orders}, {orders, customers}) == [mart, stg_c, stg_o]
    # Everything built once: only what reads orders.
    assert models_to_build(models, {orders}, {orders, customers, stg_o, stg_c, mart}) == [
        mart, stg_o]


def test_a_replica_no_model_reads_moves_the_dbt_cursor_without_a_build(topic_config) -> None:
    from binlog_assets.orchestration.dbt_follow import dbt_follow_sensor

    _topic, binlake, _kafka = topic_config
    sensor = dbt_follow_sensor({dg.AssetKey("stg"): {dg.AssetKey(["replica", "other"])}})
    with dg.instance_for_test() as instance:
        instance.report_runless_asset_event(dg.AssetMaterialization(["replica", "orders"]))
        result = sensor(dg.build_sensor_context(instance=instance,
                                                resources={"binlake": binlake}))
        assert isinstance(result, dg.SensorResult) and not result.run_requests
        assert json.loads(result.cursor)["built"] > 0


def test_sensors_that_launch_fresh_work_tick_on_every_daemon_pass() -> None:
    # An interval equal to the daemon's loop made the lag sensor tick 5 or 10 s apart.
    from dagster._daemon.asset_daemon import MIN_INTERVAL_LOOP_SECONDS
    from dagster._daemon.sensor import MIN_INTERVAL_LOOP_TIME

    from binlog_assets.orchestration.replica_follower import replica_follower_sensor
    from binlog_assets.orchestration.sensors import binlake_automation_sensor, kafka_lag_sensor

    for sensor in (kafka_lag_sensor, replica_follower_sensor, binlake_automation_sensor):
        assert sensor.minimum_interval_seconds < min(MIN_INTERVAL_LOOP_TIME,
                                                     MIN_INTERVAL_LOOP_SECONDS), sensor.name
