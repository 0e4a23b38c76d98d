"""dbt's side of the config: the generated profile opens the pipeline's warehouse (or
its Spark Connect server), models land in `<database>_marts`, and dbt assets join
binlake's group with no automation of their own."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import sqlglot
import yaml

from binlog_assets.config import parse_config
from binlog_assets.lakehouse.spark import spark_conf
from binlog_assets.orchestration.dbt import (
    DBT_PROJECT_DIR,
    BinlakeDbtTranslator,
    build_dbt_assets,
    dbt_env,
    write_profiles,
)
from jobs import dbt_hourly_schedule


def _profile(tmp_path: Path, **spark) -> tuple[dict, object]:
    pipeline = parse_config({"lakehouse": {"path": str(tmp_path / "lake"), "database": "shopdb"},
                        "spark": spark})
    directory = write_profiles(pipeline, tmp_path / "dbt")
    return yaml.safe_load((directory / "profiles.yml").read_text()), pipeline


def test_profile_uses_the_pipelines_warehouse_and_marts_schema(tmp_path: Path) -> None:
    profile, pipeline = _profile(tmp_path)
    out = profile["binlake"]["outputs"]["local"]
    assert (out["type"], out["method"], out["schema"]) == ("spark", "session", "shopdb_marts")
    assert out["server_side_parameters"] == spark_conf(pipeline)
    assert str(tmp_path / "lake") in out["server_side_parameters"]["spark.sql.warehouse.dir"]
    assert dbt_env(pipeline) == {"BINLAKE_DATABASE": "shopdb"}


def test_profile_over_spark_connect_names_only_the_server(tmp_path: Path) -> None:
    profile, _ = _profile(tmp_path, remote="sc://127.0.0.1:15002")
    params = profile["binlake"]["outputs"]["local"]["server_side_parameters"]
    assert params == {"spark.remote": "sc://127.0.0.1:15002"}


def test_dbt_assets_join_binlakes_group_without_automation() -> None:
    translator = BinlakeDbtTranslator()
    props = {"resource_type": "model", "name": "stg_orders", "fqn": ["binlake", "stg_orders"]}
    assert translator.get_group_name(props) == "binlake"
    assert translator.get_automation_condition(props) is None


def test_each_database_gets_its_own_manifest_and_table_names(
        tmp_path: Path, monkeypatch) -> None:
    """Two configurations in turn (as BINLAKE_CONFIG switches them): each dbt asset's
    table name is its own database's marts, not the first one parsed."""
    monkeypatch.setenv("BINLAKE_VAR_DIR", str(tmp_path / "var"))
    names = {}
    for database in ("dbtswitch_a", "dbtswitch_b"):
        pipeline = parse_config({"lakehouse": {"path": str(tmp_path / "lake"),
                                          "database": database}})
        try:
            assets, _resource = build_dbt_assets(pipeline)
        finally:
            shutil.rmtree(DBT_PROJECT_DIR / "target" / database, ignore_errors=True)
        spec = next(s for s in assets.specs if s.key == dg.AssetKey("customer_revenue"))
        names[database] = spec.metadata["dagster/table_name"]
    assert names == {"dbtswitch_a": "dbtswitch_a_marts.customer_revenue",
                     "dbtswitch_b": "dbtswitch_b_marts.customer_revenue"}


# What Spark makes of each model over the demo shop's replicas (checked with Spark:
# count() is bigint; sum(int * decimal(12,2)) is decimal(33,2)).
MODEL_COLUMNS = {
    "stg_customers": {"customer_id": "int", "customer_name": "string", "email": "string",
                      "changed_at_ms": "timestamp"},
    "stg_products": {"product_id": "int", "product_name": "string",
                     "price": "decimal(12,2)"},
    "stg_orders": {"order_key": "string", "shard": "string", "order_id": "int",
                   "customer_id": "int", "product_id": "int", "quantity": "int",
                   "status": "string"},
    "customer_revenue": {"customer_id": "int", "customer_name": "string",
                         "orders": "bigint", "revenue": "decimal(33,2)"},
}


@pytest.fixture(scope="module")
def dbt_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dg.AssetsDefinition]:
    """The dbt assets as the code location builds them (one dbt parse for the module)."""
    tmp_path = tmp_path_factory.mktemp("dbt_ui")
    database = "dbtui"
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("BINLAKE_VAR_DIR", str(tmp_path / "var"))
        pipeline = parse_config({"lakehouse": {"path": str(tmp_path / "lake"),
                                          "database": database}})
        try:
            assets, _resource = build_dbt_assets(pipeline)
            yield assets
        finally:
            shutil.rmtree(DBT_PROJECT_DIR / "target" / database, ignore_errors=True)


def test_each_model_shows_its_columns_with_types_and_descriptions(
        dbt_models: dg.AssetsDefinition) -> None:
    specs = {s.key.to_user_string(): s for s in dbt_models.specs}
    assert set(specs) == set(MODEL_COLUMNS)
    for name, expected in MODEL_COLUMNS.items():
        metadata = specs[name].metadata
        assert metadata["dagster/table_name"] == f"dbtui_marts.{name}"
        columns = metadata["dagster/column_schema"].columns
        assert {c.name: c.type for c in columns} == expected, name
        assert all(c.description and c.description.strip() for c in columns), name


def test_declared_columns_are_the_ones_each_model_selects(
        dbt_models: dg.AssetsDefinition) -> None:
    """A column added to (or dropped from) a model's SQL and not its schema.yml fails
    here: the UI would show a schema the table does not have."""
    manifest = json.loads((DBT_PROJECT_DIR / "target" / "dbtui" / "manifest.json").read_text())
    models = [n for n in manifest["nodes"].values() if n["resource_type"] == "model"]
    assert {m["name"] for m in models} == set(MODEL_COLUMNS)
    for model in models:
        # ref()/source() calls become a plain table name, so the SQL parses as Spark's.
        sql = re.sub(r"\{\{.*?\}\}", "t", model["raw_code"])
        selected = sqlglot.parse_one(sql, read="spark").named_selects
        assert selected == list(model["columns"]), model["name"]


def test_each_dbt_test_is_a_described_asset_check(dbt_models: dg.AssetsDefinition) -> None:
    checks = {(c.asset_key.to_user_string(), c.name): c for c in dbt_models.check_specs}
    assert len(checks) == 10
    assert all(c.description and c.description.strip() for c in checks.values())
    shard = checks[("stg_orders", "accepted_values_stg_orders_shard__shop_1__shop_2")]
    assert shard.description == "Orders come only from the shards shop_1 and shop_2."


def test_each_model_links_to_its_sql(dbt_models: dg.AssetsDefinition) -> None:
    for spec in dbt_models.specs:
        refs = spec.metadata["dagster/code_references"].code_references
        sql = list((DBT_PROJECT_DIR / "models").rglob(f"{spec.key.path[-1]}.sql"))
        assert [Path(r.file_path) for r in refs] == sql


def test_the_hourly_dbt_schedule_is_off_and_says_so() -> None:
    assert dbt_hourly_schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert "Off until turned on" in (dbt_hourly_schedule.description or "")
    assert "dbt_follow_sensor" in dbt_hourly_schedule.description


def test_a_build_launched_while_a_parity_check_failed_waits(
        dbt_models: dg.AssetsDefinition, tmp_path: Path) -> None:
    from dagster_dbt import DbtCliResource

    from binlog_assets.orchestration.parity_checks import PARITY_CHECK
    from binlog_assets.orchestration.resources import BinlakeResource

    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump({"parity": {"block_dbt": True}, "sources": [
        {"name": "shop", "topics": ["shop.orders"], "connection": {"host": "db", "user": "u"},
         "tables": [{"source": "shop.orders", "replica": "orders"}]}]}))
    with dg.instance_for_test() as instance:
        instance.report_runless_asset_event(dg.AssetCheckEvaluation(
            asset_key=dg.AssetKey(["replica", "orders"]), check_name=PARITY_CHECK,
            passed=False, severity=dg.AssetCheckSeverity.ERROR))
        result = dg.materialize(
            [dbt_models], instance=instance, raise_on_error=False,
            resources={"binlake": BinlakeResource(config_path=str(path)),
                       "dbt": DbtCliResource(project_dir=str(DBT_PROJECT_DIR),
                                             dbt_executable=str(Path(sys.executable)
                                                                .with_name("dbt")))})
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert "parity check of orders failed" in str(failure.step_failure_data.error)
