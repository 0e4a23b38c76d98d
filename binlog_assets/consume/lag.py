"""Kafka lag per topic-partition: log end offset minus the consumer group's checkpoint.

Lag is `high watermark − committed`, or `high − low` when the group has committed
nothing (everything still in the log is unread). Watermarks are read uncached, so a
sensor sees what the broker has now, and one consumer answers for every partition.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from binlog_assets.consume.checkpoint import retry_retriable


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    low: int
    high: int
    committed: int | None  # None: the group never committed this partition

    @property
    def checkpoint(self) -> int:
        return self.low if self.committed is None else max(self.committed, self.low)

    @property
    def lag(self) -> int:
        return max(0, self.high - self.checkpoint)


def topic_partitions(consumer: Consumer, topics: Iterable[str]) -> list[tuple[str, int]]:
    """Existing partitions of `topics` (a topic that does not exist yet has none)."""
    meta = consumer.list_topics(timeout=30)
    out = []
    for topic in topics:
        t = meta.topics.get(topic)
        if t is None or t.error is not None:
            continue
        out.extend((topic, p) for p in sorted(t.partitions))
    return out


def measure_lag(kafka_conf: dict, group_id: str, topics: Iterable[str]) -> list[PartitionLag]:
    consumer = Consumer({**kafka_conf, "group.id": group_id, "enable.auto.commit": False})
    try:
        tps = topic_partitions(consumer, topics)
        if not tps:
            return []
        committed = retry_retriable(
            lambda: consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=30),
            f"reading committed offsets of group {group_id}",
        )
        out = []
        for (topic, partition), c in zip(tps, committed, strict=True):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=30, cached=False
            )
            out.append(PartitionLag(topic, partition, low, high,
                                    c.offset if c.offset >= 0 else None))
        return out
    finally:
        consumer.close()
