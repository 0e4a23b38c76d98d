"""Asset jobs and schedules users launch from the Dagster UI.

- `consume_changelog_job`: bounded consumer runs of topic-partitions, no JVM. Launch it
  for one partition or a range, or backfill it over any set of partitions (in runs of
  `dagster.max_partitions_per_run`).
- `build_replicas_job`: apply new changelog data to the replicas (launchpad config
  `ops.replicas.config.rebuild: true` rebuilds them from the whole changelog).
- `dbt_build_job`: dbt build (models and tests) over the replicas; `dbt_follow_sensor`
  launches it for the models downstream of the replicas that change (at most once per
  `dagster.dbt_follow_seconds`). `dbt_hourly_schedule` would rebuild them all hourly
  too, but is off until turned on in the UI.
"""

import dagster as dg

from binlog_assets.orchestration.changelog_run_config import CHANGELOG_RUN_CONFIG_SCAFFOLD
from binlog_assets.orchestration.shared import (
    BUILD_JOB_NAME,
    CONSUME_JOB_NAME,
    DBT_JOB_NAME,
    ONE_PROCESS,
)

REPLICAS = dg.AssetSelection.key_prefixes("replica")
# The dbt models (their own code location: the replicas they read are another's).
DBT_MODELS = dg.AssetSelection.kind("dbt")

consume_changelog_job = dg.define_asset_job(
    name=CONSUME_JOB_NAME,
    # Partitioned as the changelog asset is (one partition per topic-partition).
    selection=dg.AssetSelection.assets("changelog"),
    description="Bounded consumer runs of Kafka topic-partitions into the changelog. To "
                "replay, set start_offset (or start_timestamp_ms) in the launchpad.",
    executor_def=ONE_PROCESS,
    config=CHANGELOG_RUN_CONFIG_SCAFFOLD,
)

build_replicas_job = dg.define_asset_job(
    name=BUILD_JOB_NAME,
    selection=REPLICAS,
    description="Apply new changelog data to every replica (or rebuild them: run config).",
    executor_def=ONE_PROCESS,
)

dbt_build_job = dg.define_asset_job(
    name=DBT_JOB_NAME,
    selection=DBT_MODELS,
    description="dbt build over the replicas: staging models, marts and their tests.",
    executor_def=ONE_PROCESS,
)

# Off by default, and saying so: dbt_follow_sensor already rebuilds after replica
# changes; the hourly rebuild is for whoever wants one regardless of changes.
dbt_hourly_schedule = dg.ScheduleDefinition(
    name="dbt_hourly_schedule",
    job=dbt_build_job,
    cron_schedule="15 * * * *",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description=("Off until turned on in the UI: then rebuilds the dbt models every hour "
                 "at :15. dbt_follow_sensor is what follows the replicas (a build after "
                 "they change)."),
)
