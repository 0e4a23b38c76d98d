"""A terminated replica build ends at the apply in progress.

Dagster terminates a run by interrupting its process (SIGINT, raised in the step as
`DagsterExecutionInterruptedError`). The replicas asset then starts no more replica,
cancels the Spark jobs of the applies in progress (each apply is one Delta commit: a
replica is applied or left as it was), and ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import orjson
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable
from run_inputs import interrupt_when, run_config_file

from binlog_assets.config import PipelineConfig, load_config
from binlog_assets.dev.kafka import create_topic
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.orchestration.partitions import partition_key
from binlog_assets.rounds.round import consume_partitions

CHILD = Path(__file__).with_name("replicas_child.py")
TABLES = 16
ROWS = 20  # inserts per table


def replica_key_of(i: int) -> dg.AssetKey:
    return dg.AssetKey(["replica", f"t{i}"])


def _replica_keys() -> list[dg.AssetKey]:
    return [replica_key_of(i) for i in range(TABLES)]


def _materialized(home: Path) -> set[dg.AssetKey]:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return {key for key in _replica_keys()
                if instance.fetch_materializations(key, limit=1).records}


def _build(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CHILD)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(600)
def test_an_interrupted_replica_build_ends_at_the_apply_in_progress(
        pipeline_config: PipelineConfig, tmp_path: Path) -> None:
    bootstrap = pipeline_config.bootstrap_servers
    topic = create_topic(bootstrap, "many", partitions=1)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(TABLES * ROWS):
        row = {"id": i, "v": i}
        producer.produce(topic, key=orjson.dumps({"id": i}), value=orjson.dumps({
            "before": None, "after": row, "op": "c", "ts_ms": i,
            "source": {"db": "shop", "table": f"t{i % TABLES}", "file": "mysql-bin.000001",
                       "pos": 100 + i, "row": 0, "snapshot": "false"}}))
    assert producer.flush(30) == 0
    # A lakehouse of its own: the child's Spark holds its embedded catalog.
    config_path = run_config_file(
        pipeline_config, tmp_path,
        {"name": "many", "topics": [topic],
         "tables": [{"source": f"shop.t{i}", "replica": f"t{i}"} for i in range(TABLES)]},
        lakehouse={**pipeline_config.lakehouse.model_dump(mode="json", exclude_none=True),
                   "path": str(tmp_path / "lake"), "database": "many"},
        spark={**pipeline_config.spark.model_dump(mode="json", exclude_none=True),
               "parallel_replicas": 1})
    pipeline = load_config(config_path)
    (outcome,) = consume_partitions(pipeline, dict(pipeline.kafka), [partition_key(topic, 0)],
                                    ChangelogRunConfig(), group=pipeline.kafka["group.id"])
    assert outcome.error is None and outcome.summary.committed_offset == TABLES * ROWS
    home = tmp_path / "dagster"
    home.mkdir()
    env = {**os.environ, "BINLAKE_CONFIG": str(config_path), "DAGSTER_HOME": str(home)}

    ended, err = interrupt_when(_build(env), lambda: bool(_materialized(home)), timeout=300)
    built = _materialized(home)
    # That it stopped is the count of replicas built; the deadline is liveness only, far
    # above a cancelled apply's second or two on a loaded machine.
    assert ended < 60, f"the build ended {ended:.1f}s after its interrupt: {err[-3000:]}"
    assert len(built) < TABLES // 2, built
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_run_records()
        assert run.dagster_run.status != dg.DagsterRunStatus.SUCCESS
    # Each replica is whole or absent: the reported ones, and at most the one whose
    # apply was cancelled in its commit's last moment; the others were never started.
    tables = {path.name: DeltaTable(str(path)).to_pyarrow_table().num_rows
              for path in (tmp_path / "lake" / "warehouse" / "many.db").iterdir()
              if DeltaTable.is_deltatable(str(path)) and path.name.startswith("t")}
    assert {f"t{i}" for i in range(TABLES)
            if replica_key_of(i) in built} <= set(tables), tables
    assert len(tables) <= len(built) + 1, tables
    assert set(tables.values()) == {ROWS}, tables
