"""An idle replica on a source whose binlog cannot be read back is checked all the same:
Debezium's heartbeat action writes the source's heartbeat table every few seconds, so the
changelog's position in the source's binlog moves while the replica's tables are idle.
Without heartbeats the check waits out `parity.wait_seconds` and says it could not tell
whether the replica applied past the source's snapshot."""

from __future__ import annotations

import threading
import time

import pytest
from life_lib import ShopLife, assert_equal, grant_parity, purge_to

from binlog_assets.config import PipelineConfig
from binlog_assets.dev import drills, shop
from binlog_assets.dev.connect import KafkaConnect
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.parity.check import check_replica


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory):
    source = MariaDBServer(tmp_path_factory.mktemp("source"), server_id=9)
    source.start()
    try:
        shop.create_schema(source.connect())
        grant_parity(source)
        yield source
    finally:
        source.stop()


@pytest.mark.parametrize("heartbeat_seconds", [1.0, pytest.param(0.0, marks=pytest.mark.long)])
def test_an_idle_replica_is_checked_by_the_heartbeats_position(
        heartbeat_seconds: float, server: MariaDBServer, debezium_connect: KafkaConnect,
        pipeline_config: PipelineConfig, spark) -> None:
    life = ShopLife(pipeline_config, debezium_connect, server, spark,
                    heartbeat_seconds=heartbeat_seconds, parity_wait_seconds=15)
    life.start()
    stop = threading.Event()
    try:
        shop.random_workload(server.connect(), 80, 60)
        assert_equal(life.sync(), "before")
        # The binlog from where the changelog stands on cannot be read back any more
        # (purged: as a long one would be too long to read), and the tables stay idle.
        server.rotate_binlog()
        [(current, *_)] = server.execute("SHOW MASTER STATUS")
        purge_to(server, current)

        def follow() -> None:  # the changelog follower, in short
            while not stop.is_set():
                life.consume()
                time.sleep(0.5)

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        report = check_replica(life.pipeline, "customers", life.kafka_conf,
                               life.pipeline.kafka["group.id"])
    finally:
        stop.set()
        life.stop()
    drills.record(f"heartbeat_{heartbeat_seconds:g}s", {"summary": report.summary(),
                                                       "progress": report.progress,
                                                       "wait_seconds": report.wait_seconds})
    if heartbeat_seconds:
        # The heartbeats' changes took the changelog's position into the binlog kept.
        assert report.passed, report.summary()
        assert report.progress.startswith(f"the changelog reached binlog {current[-6:]}"), \
            report.progress
    else:
        assert not report.passed and "cannot be read" in report.progress, report.progress
