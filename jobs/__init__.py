"""Asset jobs and schedules users launch from the Dagster UI."""

import dagster as dg

from binlog_assets.orchestration.partitions import kafka_partitions_def
from binlog_assets.orchestration.sensors import CONSUME_JOB_NAME

smoke_job = dg.define_asset_job(
    name="smoke_job",
    selection=dg.AssetSelection.groups("smoke"),
    description="Smoke run of the local stack: Kafka change events into a Delta table.",
)

consume_changelog_job = dg.define_asset_job(
    name=CONSUME_JOB_NAME,
    selection=dg.AssetSelection.keys("changelog"),
    partitions_def=kafka_partitions_def,
    description="One bounded consumer run of a Kafka topic-partition into the changelog.",
)
