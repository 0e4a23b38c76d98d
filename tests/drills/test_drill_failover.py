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

import time

import pytest
from life_lib import ShopLife, assert_equal

from binlog_assets.config import PipelineConfig
from binlog_assets.dev import drills, shop
from binlog_assets.dev.connect import KafkaConnect
from binlog_assets.dev.mariadb import MariaDBServer


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory):
    primary = MariaDBServer(tmp_path_factory.mktemp("primary"), server_id=1)
    replica = MariaDBServer(tmp_path_factory.mktemp("replica"), server_id=2)
    primary.start()
    replica.start()
    try:
        primary.rotate_binlog(3)
        shop.create_schema(primary.connect())
        replica.replicate_from(primary)
        replica.wait_replicated(primary)
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


def test_failover_to_a_replica_and_back_loses_nothing(
        servers, debezium_connect: KafkaConnect, pipeline_config: PipelineConfig, spark
) -> None:
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
    drills.record("failover", figures)

