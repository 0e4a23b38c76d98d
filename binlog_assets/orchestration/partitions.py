"""Kafka topic-partitions as Dagster dynamic partitions.

A partition key is `topic:partition`. Kafka topic names cannot contain a colon, so the
key splits back unambiguously. The discovery sensor adds keys as topics or partitions
appear; nothing is ever removed automatically (a deleted topic's history stays visible).
"""

from __future__ import annotations

import dagster as dg

KAFKA_PARTITIONS_NAME = "kafka_topic_partitions"
kafka_partitions_def = dg.DynamicPartitionsDefinition(name=KAFKA_PARTITIONS_NAME)
# The asset these partitions belong to (the sensors and the asset module both name it).
CHANGELOG_ASSET_KEY = dg.AssetKey("changelog")


def partition_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def parse_partition_key(key: str) -> tuple[str, int]:
    topic, sep, partition = key.rpartition(":")
    if not sep or not topic or not partition.isdigit():
        raise ValueError(f"partition key {key!r} is not of the form 'topic:partition'")
    return topic, int(partition)
