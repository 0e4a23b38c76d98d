"""Replica builds through a Spark Connect server give what an in-process Spark gives.

The server is the local stack's (`SparkConnectServer`) on a lakehouse of its own; the same
changes are applied through it (in a child process: PySpark takes one kind of session per
process) and through the session's in-process Spark, and the replicas and their history
must hold the same rows.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from lake_events import (
    ALWAYS_MERGE,
    ALWAYS_REWRITE,
    TYPES,
    Partition,
    Source,
    config_for,
    row,
)

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.dev.process import free_port
from binlog_assets.dev.spark_connect import SparkConnectServer
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.lakehouse.delta_log import open_log, table_location
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder

TABLES = [{"source": "shop.orders", "replica": "orders", "history": True}]


# A server's start and a build each way: minutes on 2 cores. `make demo` builds through
# a Connect server every time; `make test-long` runs these.
pytestmark = pytest.mark.long


@pytest.fixture(scope="module")
def connect_server(pipeline_config: PipelineConfig, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[tuple[PipelineConfig, SparkConnectServer]]:
    data = pipeline_config.model_dump(mode="json", exclude_none=True)
    # A lakehouse of its own: its embedded catalog belongs to the server's JVM.
    data["lakehouse"]["path"] = str(tmp_path_factory.mktemp("connect-lake"))
    data["spark"]["remote"] = f"sc://127.0.0.1:{free_port()}"
    pipeline = parse_config(data)
    server = SparkConnectServer.for_config(pipeline, tmp_path_factory.mktemp("spark-connect"))
    seconds = server.start()
    print(f"\nspark connect server {pipeline.spark.remote} ready in {seconds:.1f}s")
    try:
        yield pipeline, server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def remote_config(connect_server: tuple[PipelineConfig, SparkConnectServer]
                  ) -> PipelineConfig:
    return connect_server[0]


def scenario(spark, pipeline: PipelineConfig) -> tuple[list[str], list[str], dict[int, str]]:
    """Inserts, updates, a delete, a truncate and re-inserts over three applies: the
    replica's and the history's rows (as text, without the apply's wall-clock times)
    and the live rows' amounts."""
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = Source("shop.orders")
    a, b, c = row(1, "1.00", "a"), row(2, "2.00", "b"), row(3, "3.00", "c")
    # A column added with a default: rows older than the ADD hold it (an expression the
    # client builds, typed by an object, in the new table's first commit).
    added = replace(src.ddl({**TYPES, "tier": "string"}),
                    ddl="ALTER TABLE orders ADD COLUMN tier VARCHAR(10) DEFAULT 'std'")
    part.write(part.records([[src.insert(a)], [src.insert(b)], [added],
                             src.update(a, {**row(1, "1.50"), "tier": "gold"})]))
    builder.apply("orders")
    part.write(part.records([[src.delete(b)], [src.insert(c)]]))
    builder.apply("orders")
    part.write(part.records([[src.truncate()], [src.insert(row(4, "4.00", "d"))],
                             src.update(row(4, "4.00", "d"), row(4, "4.40", "d"))]))
    builder.apply("orders")
    db = pipeline.lakehouse.database

    def text(table: str) -> list[str]:
        return sorted(str(tuple(r)) for r in spark.table(table).drop("_applied_at").collect())

    live = {r["id"]: str(r["amount"]) for r in spark.table(f"{db}.orders_current").collect()}
    for name in ("orders", "orders_history"):
        # Tables stay delta-rs's too: no type a Connect client sent as an object (a
        # `string collate UTF8_BINARY`) may reach their schemas.
        schema = open_log(table_location(spark, db, name)).schema().to_json()
        assert "collate" not in schema, (name, schema)
    return text(f"{db}.orders"), text(f"{db}.orders_history"), live


def test_a_remote_build_equals_an_in_process_one(
        spark, pipeline_config: PipelineConfig, remote_config: PipelineConfig,
        tmp_path: Path) -> None:
    import yaml

    config_file = tmp_path / "binlake.yaml"
    config_file.write_text(yaml.safe_dump(remote_config.model_dump(mode="json",
                                                                   exclude_none=True)))
    # Both apply paths in one child: MERGE, and the one-pass rewrite.
    ratios = [ALWAYS_MERGE, ALWAYS_REWRITE]
    child = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("connect_child.py")),
         str(config_file), *map(str, ratios)],
        capture_output=True, text=True, timeout=900)
    assert child.returncode == 0, child.stderr[-3000:]
    remote = ast.literal_eval(child.stdout.strip().splitlines()[-1])
    local = [scenario(spark, config_for(pipeline_config, TABLES, rewrite_ratio=r))
             for r in ratios]
    assert remote == local
    assert [r[2] for r in remote] == [{4: "4.40"}, {4: "4.40"}]


def test_the_server_holds_its_lakehouse_catalog(remote_config: PipelineConfig) -> None:
    # An in-process Spark on the server's lakehouse would break its embedded Derby: the
    # lock the server inherited makes it wait (here: give up at once, saying why).
    from binlog_assets.lakehouse.spark import lock_catalog

    with pytest.raises(TimeoutError, match="stayed locked"):
        lock_catalog(Path(remote_config.lakehouse.path), timeout=0)


def test_a_follower_goes_on_through_a_restart_of_its_spark_connect_server(
        connect_server: tuple[PipelineConfig, SparkConnectServer], tmp_path: Path) -> None:
    """The server stopped under a follower run and started again (the soak's fault): an
    apply meeting the server down failed, and the replica was left until the run ended,
    its sessions closed by the client. The replica is applied again once the server is
    back, on a new session where the old one is lost, and the run ends well."""
    import yaml

    remote_config, server = connect_server
    pipeline = config_for(remote_config, [{"source": "shop.items", "replica": "items"}],
                          dagster={"replica_poll_seconds": 0.2})
    config_file = tmp_path / "binlake.yaml"
    config_file.write_text(yaml.safe_dump(pipeline.model_dump(mode="json",
                                                              exclude_none=True)))
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("connect_follower_child.py")),
         str(config_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        for step, act in (("stop", server.stop), ("start", server.start)):
            assert child.stdout.readline().strip() == step
            act()
            child.stdin.write("go\n")
            child.stdin.flush()
        out, _ = child.communicate(timeout=900)
    finally:
        child.kill()
    assert child.returncode == 0, out[-3000:]
    outcome = ast.literal_eval(out.strip().splitlines()[-1])
    assert outcome["reached"] == [1, 2], outcome
    assert outcome["ids"] == [1, 2], outcome
    assert outcome["success"], outcome
    # The apply that met the server down waited in the client's retries: the run's log
    # named the server and the wait while it lasted.
    assert any("Spark Connect at" in w and "has not answered for" in w
               for w in outcome["warnings"]), outcome
    print(outcome)
