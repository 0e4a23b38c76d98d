"""The one place that builds binlake's `dg.Definitions` (loaded via workspace.yaml)."""

import dagster as dg

from binlog_assets.config import load_config
from binlog_assets.orchestration.assets import smoke_changelog
from binlog_assets.orchestration.changelog_asset import changelog
from binlog_assets.orchestration.resources import BinlakeResource, spark_resource
from binlog_assets.orchestration.sensors import kafka_lag_sensor, kafka_partition_discovery_sensor
from jobs import consume_changelog_job, smoke_job

# Validated at load: a bad config fails the code location with the field named.
PIPELINE_CONFIG = load_config()

defs = dg.Definitions(
    assets=[smoke_changelog, changelog],
    jobs=[smoke_job, consume_changelog_job],
    sensors=[kafka_partition_discovery_sensor, kafka_lag_sensor],
    resources={
        "binlake": BinlakeResource(),
        "pyspark": spark_resource(PIPELINE_CONFIG),
    },
)
