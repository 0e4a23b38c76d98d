"""Kafka lag per topic-partition: log end offset minus the consumer group's checkpoint.

Lag is `high watermark − committed`, or `high − low` when the group has committed
nothing (everything still in the log is unread). Watermarks are read uncached, so a
sensor sees what the broker has now, and one consumer answers for every partition.

The watermarks of all partitions come in two batched ListOffsets requests (earliest,
latest) per partition leader, not two round trips per partition: the high end under the
consumer's `isolation.level` (with `read_committed`, the last stable offset), exactly
what `get_watermark_offsets(cached=False)` returns for one partition. A sensor tick over
1,000 partitions costs a handful of round trips (`bench/bench_lag_sensor.py`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from binlog_assets.consume.checkpoint import retry_retriable
from binlog_assets.consume.preflight import check_cluster, describe

# A request to the cluster that takes this long waited for a broker (restarting, frozen,
# unreachable): a caller that measures again and again says so (`waited_for_kafka`).
SLOW_ANSWER_SECONDS = 5.0


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


def topic_named(topic: str, entry: str) -> bool:
    """Whether `entry` of a topic list names `topic`: by name, or, starting with `^`, as a
    regex over the cluster's topics (internal ones aside)."""
    if not entry.startswith("^"):
        return topic == entry
    return not topic.startswith("__") and re.match(entry, topic) is not None


def topic_partitions(consumer: Consumer, topics: Iterable[str]) -> list[tuple[str, int]]:
    """Existing partitions of `topics` (a topic that does not exist yet has none); an
    entry starting with `^` is a regex over the cluster's topics (internal ones aside)."""
    meta = consumer.list_topics(timeout=30)
    names: list[str] = []
    for topic in topics:
        if topic.startswith("^"):
            names += sorted(n for n in meta.topics if topic_named(n, topic))
        else:
            names.append(topic)
    out = []
    for topic in dict.fromkeys(names):
        t = meta.topics.get(topic)
        if t is None or t.error is not None:
            continue
        out.extend((topic, p) for p in sorted(t.partitions))
    return out


def lags_of(lags: Iterable[PartitionLag], topics: Iterable[str]) -> list[PartitionLag]:
    """Those of `lags` that `measure_lag` of `topics` would return: one measurement of
    several topic lists' topics, split by list."""
    entries = list(topics)
    return [pl for pl in lags if any(topic_named(pl.topic, e) for e in entries)]


def lag_consumer(kafka_conf: dict, group_id: str, error_cb: Any = None) -> Consumer:
    """A consumer that only asks the cluster for offsets (never subscribes nor commits);
    `error_cb` gets librdkafka's client errors (served by `poll(0)`, which, the consumer
    having no assignment, returns no record)."""
    extra = {"error_cb": error_cb} if error_cb is not None else {}
    return Consumer({**kafka_conf, "group.id": group_id, "enable.auto.commit": False,
                     **extra})


def high_watermark(kafka_conf: dict, topic: str, partition: int) -> int:
    """The partition's end offset now (0 for a topic that does not exist)."""
    consumer = lag_consumer(kafka_conf, "binlake-watermark")
    try:
        if topic not in consumer.list_topics(topic, timeout=10).topics:
            return 0
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30,
                                              cached=False)[1]
    finally:
        consumer.close()


# librdkafka's errors for a broker that went away (closed connections, refused
# reconnects, every broker down): what a follower reports as Kafka being unreachable.
UNREACHABLE = (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT)


class Unreachable:
    """An `error_cb` that keeps librdkafka's broker-connection errors until `taken`."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def __call__(self, error: KafkaError) -> None:
        if error.code() in UNREACHABLE:
            self.errors.append(error.str())

    def warning(self, kafka_conf: dict, what: str, seconds: float) -> str | None:
        """The warning for the errors seen since the last call (None without any): Kafka
        was unreachable during `what`, which took `seconds`."""
        errors, self.errors = self.errors, []
        if not errors:
            return None
        return (f"Kafka at {describe(kafka_conf)} was unreachable during {what} "
                f"({len(errors)} connection errors, the first: {errors[0]}); it waited "
                f"{seconds:.1f} s")


def measure_lag(kafka_conf: dict, group_id: str, topics: Iterable[str], *,
                check: bool = True, consumer: Consumer | None = None) -> list[PartitionLag]:
    """Lag of every partition of `topics`; `check=False` when the caller has just checked
    the cluster (`check_cluster`) itself. A caller that measures again and again passes
    its own `consumer` (`lag_consumer`), which stays open."""
    # Wrong credentials fail here within a second, not as a 30 s metadata timeout.
    if check:
        check_cluster(kafka_conf)
    own = consumer is None
    if own:
        consumer = lag_consumer(kafka_conf, group_id)
    try:
        tps = topic_partitions(consumer, topics)
        if not tps:
            return []
        committed = retry_retriable(
            lambda: consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=30),
            f"reading committed offsets of group {group_id}",
        )
        lows = _log_ends(consumer, tps, OFFSET_BEGINNING)
        highs = _log_ends(consumer, tps, OFFSET_END)
        return [PartitionLag(topic, partition, low, high, c.offset if c.offset >= 0 else None)
                for (topic, partition), c, low, high in zip(tps, committed, lows, highs,
                                                             strict=True)]
    finally:
        if own:
            consumer.close()


def waited_for_kafka(kafka_conf: dict, what: str, seconds: float, *,
                     answered: bool = True, waiter: str | None = None) -> str | None:
    """The warning for a request to the cluster (`what`) that took `seconds`, None when
    it took less than SLOW_ANSWER_SECONDS: a follower that waits on a broker restart or
    a frozen broker names what it waits for and how long, instead of going quiet.
    `waiter` names the partition whose longest wait it was, when it is not the caller's."""
    if seconds < SLOW_ANSWER_SECONDS:
        return None
    if waiter is not None:
        # A consumer sees no difference between a frozen broker and records held back
        # by a producer's open transaction (read_committed): both are named.
        return (f"{waiter} waited {seconds:.1f} s at once for Kafka at "
                f"{describe(kafka_conf)} ({what}): a broker was unreachable or not "
                f"answering, or a producer's open transaction held the records back")
    if answered:
        return (f"waited {seconds:.1f} s for Kafka at {describe(kafka_conf)} to answer "
                f"{what}: a broker was unreachable or not answering, and no partition "
                f"was consumed meanwhile")
    return (f"Kafka at {describe(kafka_conf)} did not answer {what} for {seconds:.1f} s: "
            f"a broker is unreachable or not answering")


def _log_ends(consumer: Consumer, tps: list[tuple[str, int]], end: int) -> list[int]:
    """The log start (`OFFSET_BEGINNING`) or end (`OFFSET_END`) offset of every partition,
    in the order of `tps`, in one ListOffsets request per leader.

    The broker reads the timestamps -2 and -1 of a ListOffsets request as "earliest" and
    "latest", which is how librdkafka's watermark query asks for them one partition at a
    time; `offsets_for_times` sends them for all partitions at once, under the consumer's
    isolation level. Like the watermark query, an error on any partition raises.
    """
    found = consumer.offsets_for_times([TopicPartition(t, p, end) for t, p in tps], timeout=30)
    by_tp = {}
    for tp in found:
        if tp.error is not None:
            raise KafkaException(tp.error)
        by_tp[tp.topic, tp.partition] = tp.offset
    return [by_tp[tp] for tp in tps]
