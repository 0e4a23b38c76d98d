"""The source's binlog is reset or purged, or the connector's offsets are lost, while the
connector is stopped; it re-snapshots, and every replica equals its source table again:
rows changed meanwhile carry their new values, rows deleted meanwhile are gone (a table
emptied meanwhile included), on real MariaDB and Debezium."""

from __future__ import annotations

import time

import pytest
from life_lib import ShopLife, assert_equal, purge_to

from binlog_assets.config import PipelineConfig
from binlog_assets.dev import drills, shop
from binlog_assets.dev.connect import KafkaConnect
from binlog_assets.dev.mariadb import MariaDBServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    source = MariaDBServer(tmp_path_factory.mktemp("source"), server_id=7)
    source.start()
    try:
        source.rotate_binlog(2)
        shop.create_schema(source.connect())
        yield source
    finally:
        source.stop()


def _gap(server: MariaDBServer, seed: int) -> None:
    """What happens while the connector is away: updates, deletes, inserts, and one
    table emptied."""
    shop.random_workload(server.connect(), seed, 60)
    server.execute("DELETE FROM shop_2.orders")


@pytest.mark.parametrize("how", ["reset", pytest.param("purge", marks=pytest.mark.long),
                                 pytest.param("offsets", marks=pytest.mark.long)])
def test_a_re_snapshot_after_the_binlog_or_the_offsets_are_gone_loses_nothing(
        how: str, server: MariaDBServer, debezium_connect: KafkaConnect,
        pipeline_config: PipelineConfig, spark) -> None:
    life = ShopLife(pipeline_config, debezium_connect, server, spark,
                    snapshot_mode="when_needed")
    began = time.monotonic()
    life.start()
    try:
        shop.random_workload(server.connect(), 70, 120)
        server.execute("INSERT IGNORE INTO shop_2.orders VALUES (77, 1, 1, 1, 'new', NULL)")
        assert_equal(life.sync(), "before")
        debezium_connect.stop_connector(life.name)
        _gap(server, 71)
        if how == "reset":
            # A live primary writes on after the reset; Debezium 3.4 cannot stream from
            # a server with no GTID at all (a null GTID set).
            server.execute("RESET MASTER", "UPDATE shop.customers SET name = 'after reset'")
        elif how == "purge":
            server.rotate_binlog()
            [(current, *_)] = server.execute("SHOW MASTER STATUS")
            purge_to(server, current, end_dumps=True)
        else:
            debezium_connect.reset_offsets(life.name)
        if how == "purge":
            # Debezium 3.4 does not notice with MariaDB GTIDs that the binlog its offset
            # needs is gone: it fails streaming (error 1236). The runbook's answer is the
            # offsets-lost one: its offsets reset, it snapshots again.
            _resume_until_failed(debezium_connect, life, "Could not find GTID state")
            debezium_connect.stop_connector(life.name)
            debezium_connect.reset_offsets(life.name)
        debezium_connect.resume_connector(life.connector)
        shop.random_workload(server.connect(), 72, 30)
        assert_equal(life.sync(), f"after the {how}")
        lineages = [r.describe() for r in life.lineages()]
    finally:
        life.stop()
    drills.record(f"resnapshot_{how}", {"lineages": lineages,
                                       "seconds": round(time.monotonic() - began, 1)})
    assert len(lineages) == (1 if how == "reset" else 0), lineages


def _resume_until_failed(connect: KafkaConnect, life: ShopLife, why: str) -> None:
    connect._rest("PUT", f"/connectors/{life.name}/resume")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        tasks = connect.connector_status(life.name)["tasks"]
        if tasks and tasks[0]["state"] == "FAILED":
            assert why in tasks[0].get("trace", ""), tasks[0].get("trace", "")[:2000]
            return
        time.sleep(0.5)
    raise AssertionError(f"connector {life.name} did not fail as expected: {tasks}")
