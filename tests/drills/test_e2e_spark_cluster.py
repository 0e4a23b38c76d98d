"""Beyond one Spark: the seeded MariaDB workload through a Spark standalone cluster.

The local stack's cluster (`dev/spark_cluster.py`: a master and two workers, each its
own JVM from the PySpark distribution) runs the replica build and dbt, chosen by
configuration only (`spark.master: spark://127.0.0.1:<port>`). Debezium publishes the
workload, bounded consumer runs write the changelog (no Spark), a child process builds
the replicas on the cluster (two executors, Delta's jars shipped by `spark.jars`) and
compares each with its source; then `dbt build` runs its models and tests on the
cluster. The figures go to the drill report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from drill_lib import seeded_build, shop_config

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.dev import drills
from binlog_assets.dev.connect import DebeziumFence, KafkaConnect
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.dev.process import free_port
from binlog_assets.dev.spark_cluster import SparkCluster
from binlog_assets.orchestration.dbt import DBT_PROJECT_DIR, dbt_env, write_profiles

pytestmark = pytest.mark.long
SEED = 20261124
STATEMENTS = 300


def _cluster_config(base: PipelineConfig, lake: Path, master: str) -> PipelineConfig:
    data = shop_config(base, "e2e_cluster", lakehouse=lake).model_dump(
        mode="json", exclude_none=True)
    data["spark"] = {**data.get("spark", {}), "master": master, "conf": {
        # One executor per worker (1 core, 1 GiB each); the driver stays in the run.
        "spark.executor.cores": "1", "spark.executor.memory": "1g",
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}}
    return parse_config(data)


def _completed_apps(webui_port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=10) as r:
        return [a["name"] for a in json.load(r)["completedapps"]]


def test_seeded_workload_through_a_spark_standalone_cluster(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, debezium_fence: DebeziumFence,
    pipeline_config: PipelineConfig,
    tmp_path: Path,
) -> None:
    cluster = SparkCluster(tmp_path / "cluster")
    cluster.master.port = free_port()
    began = time.monotonic()
    cluster.start()
    started = time.monotonic() - began
    try:
        pipeline = _cluster_config(pipeline_config, tmp_path / "lake", cluster.url)
        assert pipeline.spark.master_port == cluster.master.port
        statements, summaries, consume_seconds, result = seeded_build(
            pipeline, mariadb, debezium_fence, SEED, STATEMENTS, tmp_path)
        events = sum(s.events for s in summaries)

        profiles = write_profiles(pipeline, tmp_path / "dbt-profiles")
        dbt_began = time.monotonic()
        dbt = subprocess.run(
            [str(Path(sys.executable).with_name("dbt")), "build", "--profiles-dir",
             str(profiles), "--target-path", str(tmp_path / "dbt-target")],
            cwd=DBT_PROJECT_DIR, capture_output=True, text=True, timeout=900,
            env={**os.environ, **dbt_env(pipeline)})
        dbt_seconds = time.monotonic() - dbt_began
        assert dbt.returncode == 0, dbt.stdout[-4000:]
        apps = _completed_apps(cluster.master.webui_port)
    finally:
        cluster.stop()

    compared = result["compared"]
    figures = {
        "seed": SEED, "statements": statements, "debezium_events": events,
        "cluster_start_seconds": round(started, 1), "consume_seconds": round(consume_seconds, 1),
        "executors": result["executors"], "session_seconds": result["session_seconds"],
        "replica_build_seconds": result["build_seconds"],
        "rows_compared": sum(s + r for s, r, _ in compared.values()),
        "mismatches": sum(m + abs(s - r) for s, r, m in compared.values()),
        "dbt_build_seconds": round(dbt_seconds, 1), "cluster_apps": apps,
    }
    drills.record("e2e_spark_cluster", figures)
    print(f"\nspark cluster e2e: {json.dumps(figures)}")
    assert result["master"] == cluster.url
    assert result["executors"] == 2, result  # one per worker: the build ran on the cluster
    for replica, (source_rows, replica_rows, mismatched) in compared.items():
        assert source_rows > 0 and source_rows == replica_rows and mismatched == 0, \
            (replica, compared)
    # The replica build and dbt were each an application of the cluster.
    assert len(apps) >= 2, apps
