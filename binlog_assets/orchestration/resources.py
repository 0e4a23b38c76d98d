"""Dagster resources: the pipeline config, Kafka client settings, and Spark (on demand).

Config and environment are resolved here and nowhere else: assets ask the resource for
a validated `PipelineConfig` and for librdkafka settings that already point at the
right cluster (the user's, or the embedded broker).
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

import dagster as dg

from binlog_assets.config import PipelineConfig, load_config
from binlog_assets.environment import kafka_client_config

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class BinlakeResource(dg.ConfigurableResource):
    """The validated pipeline config and Kafka settings, for assets and sensors."""

    config_path: str | None = None

    @cached_property
    def pipeline(self) -> PipelineConfig:
        return load_config(self.config_path)

    def group_id(self) -> str:
        """The consumer group of every run and sensor (`kafka.group.id`)."""
        return str(self.pipeline.kafka.get("group.id", "binlake"))

    def kafka_conf(self) -> dict[str, str | int | float | bool]:
        return kafka_client_config(self.pipeline)

    def spark(self) -> SparkSession:
        """The process's SparkSession, started on first use, once this process holds the
        local catalog lock (embedded Derby admits one Spark process at a time; see
        `hold_catalog_lock`). Only replica builds ask: a consumer run never loads pyspark."""
        from binlog_assets.lakehouse.spark import get_spark

        return get_spark(self.pipeline)
