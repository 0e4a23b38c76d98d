"""Both code locations share one asset group, one way to load the config and one
executor rule (`orchestration/location.py`, `orchestration/shared.py`)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from binlog_assets.config import parse_config
from binlog_assets.orchestration.changelog_asset import changelog
from binlog_assets.orchestration.dbt import BinlakeDbtTranslator
from binlog_assets.orchestration.kafka_sources import kafka_source_specs
from binlog_assets.orchestration.location import location_definitions, location_executor
from binlog_assets.orchestration.replica_assets import build_replica_assets
from binlog_assets.orchestration.shared import ASSET_GROUP, ONE_PROCESS
from jobs import build_replicas_job, consume_changelog_job, dbt_build_job

SOURCES = [{"name": "shop", "topics": ["shop.orders"],
            "tables": [{"source": "shop.orders", "replica": "orders"}]}]


def _config(tmp_path: Path, **more: object):
    return parse_config({"lakehouse": {"path": str(tmp_path / "lake")}, "sources": SOURCES,
                         **more})


def test_every_asset_is_in_the_one_group(tmp_path: Path) -> None:
    pipeline = _config(tmp_path)
    groups = {spec.group_name for spec in kafka_source_specs(pipeline)}
    groups |= {spec.group_name for spec in changelog.specs}
    groups |= {spec.group_name for spec in build_replica_assets(pipeline).specs}
    assert groups == {ASSET_GROUP}
    assert BinlakeDbtTranslator().get_group_name({}) == ASSET_GROUP


def test_one_executor_rule(tmp_path: Path) -> None:
    assert location_executor(_config(tmp_path)) is None
    remote = _config(tmp_path, spark={"remote": "sc://127.0.0.1:15002"})
    assert location_executor(remote) is ONE_PROCESS
    for job in (consume_changelog_job, build_replicas_job, dbt_build_job):
        assert job.executor_def is ONE_PROCESS
    defs = location_definitions(remote, resources={"other": "x"})
    assert set(defs.resources) == {"binlake", "other"}
    assert isinstance(defs, dg.Definitions)


def test_the_dbt_sources_fall_back_to_the_configs_database() -> None:
    # dbt reads lakehouse.database from BINLAKE_DATABASE (`dbt_env`); run by hand, its
    # fallback must be the config's default.
    from binlog_assets.config import LakehouseConfig
    from binlog_assets.environment import REPO_ROOT
    from binlog_assets.orchestration.dbt import dbt_env

    default = LakehouseConfig.model_fields["database"].default
    sources = (REPO_ROOT / "dbt" / "models" / "sources.yml").read_text()
    assert f"env_var('BINLAKE_DATABASE', '{default}')" in sources
    assert dbt_env(parse_config({}))["BINLAKE_DATABASE"] == default
