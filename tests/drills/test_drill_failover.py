"""The source fails over and back, on real MariaDB servers and a real Debezium: every
replica equals the primary of the moment after each step, and nothing is dropped.

A primary (server id 1, its binlog at 000004 after a few rotations) has a GTID replica
(server id 2, `log_slave_updates`, its binlog numbered from 000001). Writes on the
primary reach the replicas; the primary stops taking writes, the replica is promoted,
the connector's config is pointed at it (the runbook's Connect REST call), and updates,
deletes and inserts of rows written before and after the failover must all reach the
replicas, though the new primary's binlog coordinates are below the old one's. Then the
old primary rejoins as a replica of the new one and takes over again.
"""

from __future__ import annotations

import contextlib
import time

import pytest
from life_lib import ShopLife, assert_equal, grant_parity

from binlog_assets.config import PipelineConfig
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.dev import drills, shop
from binlog_assets.dev.connect import KafkaConnect
from binlog_assets.dev.mariadb import MariaDBServer


@pytest.fixture
def servers(tmp_path_factory: pytest.TempPathFactory):
    """A primary (server id 1) and its GTID replica (2), whose binlog numbering is lower."""
    primary = MariaDBServer(tmp_path_factory.mktemp("primary"), server_id=1)
    replica = MariaDBServer(tmp_path_factory.mktemp("replica"), server_id=2)
    primary.start()
    replica.start()
    try:
        primary.rotate_binlog(3)
        shop.create_schema(primary.connect())
        grant_parity(primary)
        replica.replicate_from(primary)
        replica.wait_replicated(primary)
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


@pytest.mark.parametrize("back", [False, pytest.param(True, marks=pytest.mark.long)])
def test_failover_to_a_replica_and_back_loses_nothing(
        back: bool, servers, debezium_connect: KafkaConnect,
        pipeline_config: PipelineConfig, spark) -> None:
    primary, replica = servers
    life = ShopLife(pipeline_config, debezium_connect, primary, spark)
    figures: dict = {}
    began = time.monotonic()
    life.start()
    try:
        shop.random_workload(primary.connect(), 59, 150)
        assert_equal(life.sync(), "before the failover")
        figures["primary_binlog"] = primary.binlog_position()[0]

        # The failover: the primary stops taking writes, its replica catches up and is
        # promoted, the connector follows it.
        primary.demote()
        replica.wait_replicated(primary)
        replica.promote()
        figures["promoted_binlog"] = replica.binlog_position()[0]
        assert figures["promoted_binlog"] < figures["primary_binlog"]
        figures["repoint_seconds"] = round(life.point_at(replica), 1)
        shop.random_workload(replica.connect(), 60, 150)
        assert_equal(life.sync(), "after the failover")
        figures["parity_after_failover"] = _parity_and_resync(life)

        if not back:
            return
        # And back: the old primary replicates the new one, then takes over again.
        primary.replicate_from(replica, fresh=False)
        primary.wait_replicated(replica)
        replica.demote()
        primary.promote()
        # The connector's schema history holds GTIDs of server 1, its offset one of server
        # 2: before Debezium 3.5.2 (dbz#1672) it would not recover its history. The
        # runbook's config change rebuilds it (`snapshot.mode: recovery`: schemas only).
        life.point_at(primary, snapshot_mode="recovery")
        shop.random_workload(primary.connect(), 61, 150)
        assert_equal(life.sync(), "after the failback")
        lineages = life.lineages()
        figures["lineages"] = [r.describe() for r in lineages]
        print("\n".join(figures["lineages"]))
        assert [r.number for r in lineages] == [2]  # the failback's numbering is higher
    finally:
        life.stop()
        figures["seconds"] = round(time.monotonic() - began, 1)
        drills.record("failover_and_back" if back else "failover", figures)



@pytest.mark.long
def test_the_old_primary_still_writing_after_a_failover_stops_its_partition(
        servers, debezium_connect: KafkaConnect, pipeline_config: PipelineConfig, spark
) -> None:
    from binlog_assets.consume.errors import PartitionStopped
    from binlog_assets.dev.connect import DebeziumConnector
    from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
    from binlog_assets.rounds.round import consume_partition

    primary, replica = servers
    life = ShopLife(pipeline_config, debezium_connect, primary, spark)
    life.start()
    # The old primary's connector, in its own Connect cluster as it would be, writes to
    # the same topics: a prefix of its own (one worker names its metrics by prefix) routed
    # onto the pipeline's topics.
    rogue = DebeziumConnector.for_server(
        primary, name=f"{life.name}-old", topic_prefix=f"{life.name}old", server_id=184199,
        database_include_list=("shop",), snapshot_mode="no_data", heartbeat_seconds=0, extra={
            "transforms": "same",
            "transforms.same.type": "org.apache.kafka.connect.transforms.RegexRouter",
            "transforms.same.regex": f"{life.name}old(.*)",
            "transforms.same.replacement": f"{life.name}$1"})
    try:
        shop.random_workload(primary.connect(), 62, 40)
        primary.execute("INSERT INTO shop.customers (id, name) VALUES (901, 'before')")
        assert_equal(life.sync(), "before the failover")
        primary.demote()
        replica.wait_replicated(primary)
        replica.promote()
        life.point_at(replica)
        for i in range(5):
            replica.execute(f"UPDATE shop.customers SET name = 'new {i}' WHERE id = 901")
        assert_equal(life.sync(), "after the failover")

        # Split brain: a connector still runs on the old primary, which takes a write.
        debezium_connect.add_connector(rogue)
        primary.execute("UPDATE shop.customers SET name = 'split brain' WHERE id = 901")
        topic = f"{life.name}.shop.customers"
        end = _end_offset(life, topic)
        _wait_for_records(life, topic, end + 1)
        with pytest.raises(PartitionStopped) as stopped:
            consume_partition(life.pipeline, life.kafka_conf, f"{topic}:0",
                              ChangelogRunConfig(), HandlerRegistry(),
                              group=life.pipeline.kafka["group.id"])
        message = str(stopped.value)
        assert f"{topic}[0]@{end}" in message and "split brain" in message
        assert "server id 1" in message and "server id 2" in message
        life.build()
        assert_equal(life.compare(), "with the old primary's write stopped")

        # The runbook: stop the old primary's connector, run past its record.
        debezium_connect.remove_connector(rogue.name)
        consume_partition(life.pipeline, life.kafka_conf, f"{topic}:0",
                          ChangelogRunConfig(start_offset=end + 1), HandlerRegistry(),
                          group=life.pipeline.kafka["group.id"])
        replica.execute("UPDATE shop.customers SET name = 'after' WHERE id = 901")
        assert_equal(life.sync(), "after the split brain")
        drills.record("split_brain", {"stopped": message[:400]})
    finally:
        for name in (rogue.name, life.name):
            with contextlib.suppress(ValueError):  # removed already
                debezium_connect.remove_connector(name)


def _end_offset(life: ShopLife, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**life.kafka_conf, "group.id": f"{life.name}-probe"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10,
                                              cached=False)[1]
    finally:
        consumer.close()


def _wait_for_records(life: ShopLife, topic: str, end: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while _end_offset(life, topic) < end:
        assert time.monotonic() < deadline, f"{topic} did not reach offset {end}"
        time.sleep(0.2)


def _parity_and_resync(life: ShopLife) -> dict:
    """Every replica's parity check passes against the promoted primary; a row damaged in
    the replica before the failover is found, and a re-sync at a position of the new
    primary's binlog repairs it (its rows rank above the damaged row's lineage)."""
    from deltalake import DeltaTable

    from binlog_assets.lakehouse.replica.routes import replica_route
    from binlog_assets.parity.check import check_replica
    from binlog_assets.parity.lake import high_watermarks, replica_uri
    from binlog_assets.parity.lineage import place_position
    from binlog_assets.parity.resync import resync_table
    from binlog_assets.parity.source import connect, source_tables

    group = life.pipeline.kafka["group.id"]
    reports = {r: check_replica(life.pipeline, r, life.kafka_conf, group)
               for r in sorted(shop.REPLICAS)}
    assert all(r.passed for r in reports.values()), {n: r.summary() for n, r in
                                                     reports.items()}
    # A row no change since the failover touched: its position is of lineage 1.
    name, damaged = next((n, r) for n in ("customers", "products")
                         for r in DeltaTable(replica_uri(life.pipeline, n))
                         .to_pyarrow_table().to_pylist()
                         if r["_position"]["phase"] == 1 and r["_op"] in ("c", "u", "r"))
    DeltaTable(replica_uri(life.pipeline, name)).update(
        predicate=f"id = {damaged['id']}", updates={"name": "'damaged'"})
    found = check_replica(life.pipeline, name, life.kafka_conf, group)
    assert found.sample_keys(5) == [f"shop.{name} {damaged['id']}: differs"], \
        found.summary()
    source = life.pipeline.sources[0]
    db = connect(source.connection)
    try:
        partitions = list(high_watermarks(life.kafka_conf, group, source))

        def lineage(position) -> int:
            return place_position(life.pipeline, source, db, position, partitions,
                                  group).lineage

        [table] = source_tables(db, replica_route(life.pipeline, name))
        chunks = resync_table(life.pipeline, name, db, table, lineage=lineage)
    finally:
        db.close()
    life.build()
    again = check_replica(life.pipeline, name, life.kafka_conf, group)
    assert again.passed, again.summary()
    return {"checked": {n: r.summary() for n, r in reports.items()},
            "damaged": f"{name} {damaged['id']}", "resynced_chunks": len(chunks)}
