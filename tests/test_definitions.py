"""The code locations load through workspace.yaml and every job resolves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dagster as dg

from binlog_assets.environment import REPO_ROOT


def test_definitions_load_and_jobs_resolve(binlake_env: Path) -> None:
    from binlog_assets.definitions import defs

    jobs = {j.name for j in defs.resolve_all_job_defs()}
    assert {"consume_changelog_job", "follow_changelog_job", "build_replicas_job",
            "follow_replicas_job"} <= jobs
    for name in jobs:
        assert defs.resolve_job_def(name) is not None
    # The consume job takes its partitions (topic-partitions) from the changelog asset.
    from binlog_assets.orchestration.partitions import kafka_partitions_def

    consume = defs.resolve_job_def("consume_changelog_job")
    assert consume.partitions_def == kafka_partitions_def
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"changelog", "replica/products"} <= keys
    assert {s.name for s in defs.sensors} == {
        "kafka_partition_discovery_sensor", "kafka_lag_sensor", "changelog_follower_sensor",
        "binlake_automation_sensor", "replica_follower_sensor"}


def _imported_with_definitions() -> list[str]:
    """The modules that importing the pipeline's code location loads, in a fresh
    interpreter."""
    proc = subprocess.run([sys.executable, "-c", "import sys, binlog_assets.definitions; "
                           "print(' '.join(sorted(sys.modules)))"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1].split()


def test_the_code_location_imports_no_dev_stack() -> None:
    # The product never depends on the dev stack (broker, MariaDB, Connect launchers).
    modules = _imported_with_definitions()
    assert "binlog_assets.environment" in modules
    assert [m for m in modules if m.startswith("binlog_assets.dev")] == []


def test_dbt_models_are_a_location_of_their_own_over_the_replicas(binlake_env: Path) -> None:
    import binlog_assets.definitions
    from binlog_assets import dbt_definitions

    # The pipeline's runs never import dbt (1.6 s of every run's start).
    assert [m for m in _imported_with_definitions() if "dbt" in m] == []
    defs = dbt_definitions.defs
    job = defs.resolve_job_def("dbt_build_job")
    assert {k.to_user_string() for k in job.asset_layer.selected_asset_keys} == {
        "stg_customers", "stg_orders", "stg_products", "customer_revenue"}
    # One graph across the locations: dbt sources are the replica assets of the other.
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey(["replica", "products"]) in graph.get(
        dg.AssetKey("stg_products")).parent_keys
    replicas = binlog_assets.definitions.defs.resolve_asset_graph().get_all_asset_keys()
    assert dg.AssetKey(["replica", "products"]) in replicas
    assert {s.name for s in defs.sensors} == {"dbt_follow_sensor"}
    assert {s.name for s in defs.schedules} == {"dbt_hourly_schedule"}


def test_workspace_yaml_validates_with_dagster_cli(binlake_env: Path) -> None:
    dagster = Path(sys.executable).parent / "dagster"
    proc = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "binlog_assets.definitions" in proc.stdout + proc.stderr
    assert "binlog_assets.dbt_definitions" in proc.stdout + proc.stderr
