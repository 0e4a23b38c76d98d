"""binlake's pipeline code location (workspace.yaml): the changelog, the replicas, their
checks, jobs and sensors. The dbt models are a location of their own
(`dbt_definitions.py`), so that no run here imports dbt."""

import warnings

import dagster as dg

from binlog_assets.orchestration.changelog_asset import changelog
from binlog_assets.orchestration.changelog_follower import (
    changelog_follower_sensor,
    follow_changelog_job,
)
from binlog_assets.orchestration.checks import changelog_lag_check, checkpoint_agreement_check
from binlog_assets.orchestration.kafka_sources import kafka_source_key, kafka_source_specs
from binlog_assets.orchestration.load_job import initial_load_sensor, load_replica_job
from binlog_assets.orchestration.location import location_config, location_definitions
from binlog_assets.orchestration.maintenance import (
    lakehouse_maintenance_job,
    lakehouse_maintenance_schedule,
)
from binlog_assets.orchestration.parity_checks import (
    build_parity_checks,
    parity_job,
    parity_schedule,
)
from binlog_assets.orchestration.replica_assets import build_replica_assets
from binlog_assets.orchestration.replica_follower import (
    follow_replicas_job,
    replica_follower_sensor,
)
from binlog_assets.orchestration.resync_job import parity_resync_sensor, resync_replica_job
from binlog_assets.orchestration.sensors import (
    binlake_automation_sensor,
    kafka_lag_sensor,
    kafka_partition_discovery_sensor,
)
from binlog_assets.orchestration.table_metadata import changelog_definition_metadata
from jobs import build_replicas_job, consume_changelog_job

PIPELINE = location_config()

# A backfill over many topic-partitions runs in batches, as the lag sensor groups them.
# The changelog reads its sources' topics, and names its table for the UI.
changelog_batched = changelog.with_attributes(backfill_policy=dg.BackfillPolicy.multi_run(
    PIPELINE.dagster.max_partitions_per_run)).map_asset_specs(
    lambda spec: spec.replace_attributes(
        deps=[kafka_source_key(s.name) for s in PIPELINE.sources],
        metadata={**spec.metadata, **changelog_definition_metadata(PIPELINE)}))


def _owned(spec: dg.AssetSpec) -> dg.AssetSpec:
    return spec.replace_attributes(owners=PIPELINE.dagster.owners)


# Each asset links to its code in the UI, and names its owners (`dagster.owners`). The
# API is marked beta: its warning would be in every run's log.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)
    ASSETS = [a.map_asset_specs(_owned) if isinstance(a, dg.AssetsDefinition) else _owned(a)
              for a in dg.with_source_code_references([
                  *kafka_source_specs(PIPELINE), changelog_batched,
                  build_replica_assets(PIPELINE)])]

# Replicas whose source has a `connection` get a parity check, a job and maybe a schedule.
PARITY_JOB = parity_job(PIPELINE)
PARITY_SCHEDULE = parity_schedule(PIPELINE, PARITY_JOB)
PARITY_RESYNC_SENSOR = parity_resync_sensor(PIPELINE)
INITIAL_LOAD_SENSOR = initial_load_sensor(PIPELINE)

defs = location_definitions(
    PIPELINE,
    assets=ASSETS,
    asset_checks=[changelog_lag_check, checkpoint_agreement_check,
                  *build_parity_checks(PIPELINE)],
    jobs=[consume_changelog_job, follow_changelog_job, build_replicas_job,
          follow_replicas_job, lakehouse_maintenance_job, resync_replica_job, load_replica_job,
          *([PARITY_JOB] if PARITY_JOB else [])],
    schedules=[lakehouse_maintenance_schedule, *([PARITY_SCHEDULE] if PARITY_SCHEDULE else [])],
    sensors=[kafka_partition_discovery_sensor, kafka_lag_sensor, changelog_follower_sensor,
             binlake_automation_sensor, replica_follower_sensor,
             *([PARITY_RESYNC_SENSOR] if PARITY_RESYNC_SENSOR else []),
             *([INITIAL_LOAD_SENSOR] if INITIAL_LOAD_SENSOR else [])],
)
