"""Dagster resources: the pipeline config, Kafka client settings, and Spark (on demand).

Config and environment are resolved here and nowhere else: assets ask the resource for
a validated `PipelineConfig` and for librdkafka settings that already point at the
right cluster (the user's, or the embedded broker).
"""

from __future__ import annotations

from functools import cached_property

import dagster as dg

from binlog_assets.config import PipelineConfig, load_config
from binlog_assets.dev.stack import kafka_client_config

# Every step that starts Spark takes a slot of this pool. The local catalog is embedded
# Derby, which admits one JVM at a time, so dagster.yaml gives pools one slot; with a
# real metastore, raise the limit (`dagster instance concurrency set spark N`).
SPARK_POOL = "spark"


# Replicas follow new changelog data (dbt follows them through `dbt_follow_sensor`).
# `eager()` also waits for every
# upstream partition to exist, and a topic-partition nobody wrote yet (say, the schema
# change topic) would hold the replicas back forever, so that part is left out.
FOLLOW_UPSTREAM = dg.AutomationCondition.eager().without(
    ~dg.AutomationCondition.any_deps_missing()
)


class BinlakeResource(dg.ConfigurableResource):
    """The validated pipeline config and Kafka settings, for assets and sensors."""

    config_path: str | None = None

    @cached_property
    def pipeline(self) -> PipelineConfig:
        return load_config(self.config_path)

    def kafka_conf(self) -> dict[str, str | int | float | bool]:
        return kafka_client_config(self.pipeline)

    def spark(self):  # noqa: ANN201 - pyspark's SparkSession, imported only here
        """The process's SparkSession, started on first use, once this process holds the
        local catalog lock (embedded Derby admits one Spark process at a time; see
        `hold_catalog_lock`). Only replica builds ask: a consumer run never loads pyspark."""
        from binlog_assets.lakehouse.spark import get_spark

        return get_spark(self.pipeline)
