"""Kafka topic-partitions as Dagster dynamic partitions, keyed `topic:partition`
(`rounds/keys.py`). The discovery sensor adds keys as topics or partitions
appear; nothing is ever removed automatically (a deleted topic's history stays visible).
"""

from __future__ import annotations

import dagster as dg

from binlog_assets.rounds.keys import parse_partition_key, partition_key

KAFKA_PARTITIONS_NAME = "kafka_topic_partitions"
kafka_partitions_def = dg.DynamicPartitionsDefinition(name=KAFKA_PARTITIONS_NAME)
# The asset these partitions belong to (the sensors and the asset module both name it).
CHANGELOG_ASSET_KEY = dg.AssetKey("changelog")


__all__ = ["CHANGELOG_ASSET_KEY", "KAFKA_PARTITIONS_NAME", "kafka_partitions_def",
           "parse_partition_key", "partition_key"]
