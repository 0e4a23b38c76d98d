"""dbt over the replicas: dbt-spark with `method: session`, on the same warehouse and catalog.

The dbt profile is generated from the pipeline config (`spark_conf`, the same settings
every binlake Spark step uses), so dbt's own SparkSession opens the same warehouse and
Hive catalog and finds the replicas' `<replica>_current` views. The dbt sources carry
`meta.dagster.asset_key` = the replica assets, so the asset graph is one piece, and dbt
tests show up as asset checks. dbt runs in its own process (the dbt CLI) and the local
catalog is embedded Derby, one JVM at a time: dbt steps share the `spark` pool with the
other Spark steps, so they never hold the catalog together. With `spark.remote`, dbt's
session is one more client of that Spark Connect server, and takes no pool slot.

What the UI shows comes from the dbt project's YAML: each model's declared columns
(`data_type`, `description`) become its `dagster/column_schema`, its relation its
`dagster/table_name`, each data test's `description` its asset check's description, and
each model links to its .sql file (a code reference).
"""

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import yaml
from dagster_dbt import (
    DagsterDbtTranslator,
    DagsterDbtTranslatorSettings,
    DbtCliResource,
    DbtProject,
    dbt_assets,
)

from binlog_assets.config import PipelineConfig
from binlog_assets.environment import REPO_ROOT, var_dir
from binlog_assets.lakehouse.spark import hold_catalog_lock, spark_conf
from binlog_assets.orchestration.parity_checks import failed_parity, parity_held_message
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import ASSET_GROUP, SPARK_POOL

DBT_PROJECT_DIR = REPO_ROOT / "dbt"


class BinlakeDbtTranslator(DagsterDbtTranslator):
    """dbt models in binlake's group. They carry no automation condition: one
    `dbt_build_job` run builds those downstream of the replicas that changed
    (`dbt_follow_sensor`)."""

    def get_automation_condition(self, dbt_resource_props: Mapping[str, Any]
                                 ) -> dg.AutomationCondition | None:
        return None

    def get_group_name(self, dbt_resource_props: Mapping[str, Any]) -> str:
        return ASSET_GROUP

    def get_asset_check_spec(self, asset_spec: dg.AssetSpec, manifest: Mapping[str, Any],
                             unique_id: str, project: DbtProject | None
                             ) -> dg.AssetCheckSpec | None:
        """dagster-dbt describes a check by the test's `meta.description`; dbt (1.9+) has
        a `description` of its own on data tests, the one our schema.yml files set."""
        spec = super().get_asset_check_spec(asset_spec, manifest, unique_id, project)
        if spec is None or spec.description:
            return spec
        description = self.get_resource_props(manifest, unique_id).get("description")
        return spec._replace(description=description or None)


def profiles_dir() -> Path:
    return var_dir() / "dbt"


def write_profiles(pipeline: PipelineConfig, directory: Path | None = None) -> Path:
    """Write profiles.yml for this config; returns its directory."""
    directory = directory or profiles_dir()
    directory.mkdir(parents=True, exist_ok=True)
    # Over Spark Connect, dbt's session is a client of the same server (dbt-spark's
    # builder goes remote when `spark.remote` is among its settings).
    params = ({"spark.remote": pipeline.spark.remote} if pipeline.spark.remote
              else spark_conf(pipeline))
    profile = {
        "binlake": {
            "target": "local",
            "outputs": {
                "local": {
                    "type": "spark",
                    "method": "session",
                    "host": "NA",  # unused by the session method, required by the schema
                    "schema": f"{pipeline.lakehouse.database}_marts",
                    # Models and tests that do not depend on each other run together:
                    # each is a few small Spark jobs and driver round trips.
                    "threads": 4,
                    "server_side_parameters": params,
                }
            },
        }
    }
    (directory / "profiles.yml").write_text(yaml.safe_dump(profile, sort_keys=True))
    return directory


def dbt_env(pipeline: PipelineConfig) -> dict[str, str]:
    return {"BINLAKE_DATABASE": pipeline.lakehouse.database}


def prepare_manifest(pipeline: PipelineConfig) -> DbtProject:
    """The dbt project with a parsed manifest of its own for the configured database
    (parsed now when missing or stale)."""
    directory = write_profiles(pipeline)
    # The manifest names each model's relation, the database's marts schema included:
    # one manifest per configured database, or another config's names would show.
    target = Path("target") / pipeline.lakehouse.database
    project = DbtProject(project_dir=DBT_PROJECT_DIR, profiles_dir=directory,
                         target_path=target)
    sources = [p for p in DBT_PROJECT_DIR.rglob("*") if p.suffix in (".sql", ".yml")
               and "target" not in p.relative_to(DBT_PROJECT_DIR).parts]
    manifest = project.manifest_path
    if not manifest.exists() or any(p.stat().st_mtime > manifest.stat().st_mtime
                                    for p in sources):
        dbt = Path(sys.executable).with_name("dbt")
        subprocess.run(
            [str(dbt), "parse", "--quiet", "--profiles-dir", str(directory),
             "--target-path", str(target)],
            cwd=DBT_PROJECT_DIR, check=True, env={**os.environ, **dbt_env(pipeline)},
            timeout=300,
        )
    return project


def build_dbt_assets(pipeline: PipelineConfig) -> tuple[dg.AssetsDefinition, DbtCliResource]:
    project = prepare_manifest(pipeline)

    # The pool keeps dbt's JVM and a replica build's off the embedded catalog at once; a
    # Spark Connect server serves both together.
    @dbt_assets(manifest=project.manifest_path, project=project,
                pool=None if pipeline.spark.remote else SPARK_POOL,
                dagster_dbt_translator=BinlakeDbtTranslator(
                    DagsterDbtTranslatorSettings(enable_code_references=True)))
    def binlake_dbt_models(context: dg.AssetExecutionContext, dbt: DbtCliResource,
                           binlake: BinlakeResource) -> Iterator[Any]:
        """Staging models over the replicas and the marts built on them (dbt build: models
        and their tests, the tests reported as asset checks)."""
        # A build launched by hand or by the schedule holds back too.
        if binlake.pipeline.parity.block_dbt and (
                failed := failed_parity(context.instance, binlake.pipeline)):
            raise dg.Failure(description=parity_held_message(failed), allow_retries=False)
        # dbt's Spark opens the same embedded catalog: the step holds its lock meanwhile
        # (nothing to hold when the catalog is a Spark Connect server's).
        hold_catalog_lock(binlake.pipeline)
        yield from dbt.cli(["build"], context=context).stream()

    os.environ.update(dbt_env(pipeline))
    resource = DbtCliResource(project_dir=project, profiles_dir=str(project.profiles_dir),
                              dbt_executable=str(Path(sys.executable).with_name("dbt")))
    return binlake_dbt_models, resource
