"""A Kafka topic-partition's key, `topic:partition`. Kafka topic names cannot contain a
colon, so the key splits back unambiguously."""

from __future__ import annotations


def partition_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def parse_partition_key(key: str) -> tuple[str, int]:
    topic, sep, partition = key.rpartition(":")
    if not sep or not topic or not partition.isdigit():
        raise ValueError(f"partition key {key!r} is not of the form 'topic:partition'")
    return topic, int(partition)
