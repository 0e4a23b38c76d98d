"""The code location loads through workspace.yaml and every job resolves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dagster as dg

from binlog_assets.dev.paths import REPO_ROOT


def test_definitions_load_and_jobs_resolve(binlake_env: Path) -> None:
    from binlog_assets.definitions import defs

    jobs = {j.name for j in defs.resolve_all_job_defs()}
    assert {"consume_changelog_job", "build_replicas_job", "dbt_build_job"} <= jobs
    for name in jobs:
        assert defs.resolve_job_def(name) is not None
    # The consume job takes its partitions (topic-partitions) from the changelog asset.
    from binlog_assets.orchestration.partitions import kafka_partitions_def

    consume = defs.resolve_job_def("consume_changelog_job")
    assert consume.partitions_def == kafka_partitions_def
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    # One graph: changelog -> replicas -> dbt models, with dbt sources mapped to replicas.
    assert {"changelog", "replica/products", "stg_products", "customer_revenue"} <= keys
    deps = defs.resolve_asset_graph().get(dg.AssetKey("stg_products")).parent_keys
    assert dg.AssetKey(["replica", "products"]) in deps
    assert {s.name for s in defs.sensors} == {
        "kafka_partition_discovery_sensor", "kafka_lag_sensor", "binlake_automation_sensor",
        "dbt_follow_sensor"}


def test_workspace_yaml_validates_with_dagster_cli(binlake_env: Path) -> None:
    dagster = Path(sys.executable).parent / "dagster"
    proc = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "binlog_assets.definitions" in proc.stdout + proc.stderr
