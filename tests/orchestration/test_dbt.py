"""dbt's side of the config: the generated profile opens the pipeline's warehouse (or
its Spark Connect server), models land in `<database>_marts`, and dbt assets join
binlake's group with no automation of their own."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from binlog_assets.config import parse_config
from binlog_assets.lakehouse.spark import spark_conf
from binlog_assets.orchestration.dbt import BinlakeDbtTranslator, dbt_env, write_profiles


def _profile(tmp_path: Path, **spark) -> tuple[dict, object]:
    cfg = parse_config({"lakehouse": {"path": str(tmp_path / "lake"), "database": "shopdb"},
                        "spark": spark})
    directory = write_profiles(cfg, tmp_path / "dbt")
    return yaml.safe_load((directory / "profiles.yml").read_text()), cfg


def test_profile_uses_the_pipelines_warehouse_and_marts_schema(tmp_path: Path) -> None:
    profile, cfg = _profile(tmp_path)
    out = profile["binlake"]["outputs"]["local"]
    assert (out["type"], out["method"], out["schema"]) == ("spark", "session", "shopdb_marts")
    assert out["server_side_parameters"] == spark_conf(cfg)
    assert str(tmp_path / "lake") in out["server_side_parameters"]["spark.sql.warehouse.dir"]
    assert dbt_env(cfg) == {"BINLAKE_DATABASE": "shopdb"}


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
    import dagster as dg

    from binlog_assets.orchestration.dbt import DBT_PROJECT_DIR, build_dbt_assets

    monkeypatch.setenv("BINLAKE_VAR_DIR", str(tmp_path / "var"))
    names = {}
    for database in ("dbtswitch_a", "dbtswitch_b"):
        cfg = parse_config({"lakehouse": {"path": str(tmp_path / "lake"),
                                          "database": database}})
        try:
            assets, _resource = build_dbt_assets(cfg)
        finally:
            shutil.rmtree(DBT_PROJECT_DIR / "target" / database, ignore_errors=True)
        spec = next(s for s in assets.specs if s.key == dg.AssetKey("customer_revenue"))
        names[database] = spec.metadata["dagster/table_name"]
    assert names == {"dbtswitch_a": "dbtswitch_a_marts.customer_revenue",
                     "dbtswitch_b": "dbtswitch_b_marts.customer_revenue"}
