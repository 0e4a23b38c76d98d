"""dbt's side of the config: the generated profile opens the pipeline's warehouse (or
its Spark Connect server), models land in `<database>_marts`, and dbt assets join
binlake's group with no automation of their own."""

from __future__ import annotations

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
