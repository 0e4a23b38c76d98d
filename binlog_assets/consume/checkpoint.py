"""Where a partition resumes: the checkpoint, chosen by a fixed precedence of sources.

The precedence is: an explicit run-config override, then the changelog table's
own transaction state (atomic with the data), then the latest materialization metadata,
then Kafka's committed offset, then the configured reset policy. Each source is a small
callable returning a `Checkpoint` or None; `resolve_checkpoint` takes the first answer
and keeps every other answer so a disagreement can be reported, never silently dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from binlog_assets.consume.offsets import OffsetTracker

OVERRIDE = "override"
CHANGELOG = "changelog"
METADATA = "metadata"
KAFKA = "kafka"
RESET = "reset"


@dataclass(frozen=True)
class Checkpoint:
    """Resume at `offset`; offsets in `done_beyond` were finished by an earlier run."""

    offset: int
    source: str
    done_beyond: frozenset[int] = field(default_factory=frozenset)


CheckpointSource = Callable[[], "Checkpoint | None"]
T = TypeVar("T")

# librdkafka does not flag these as retriable on every call, yet each only means the
# group coordinator is moving or still loading (a fresh broker, a broker restart).
# _WAIT_COORD is the client's own "still looking for the coordinator": after a broker
# restart a synchronous commit met it and failed the run, where waiting would have done.
_COORDINATOR_ERRORS = frozenset({
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError._WAIT_COORD,
})


def retry_retriable(call: Callable[[], T], what: str, timeout: float = 60.0) -> T:
    """Run a Kafka client call, retrying errors Kafka marks retriable (a group coordinator
    that is moving or still loading) until `timeout`; anything else raises at once."""
    deadline = time.monotonic() + timeout
    delay = 0.1
    while True:
        try:
            return call()
        except KafkaException as e:
            err = e.args[0] if e.args else None
            retriable = isinstance(err, KafkaError) and (
                err.retriable() or err.code() in _COORDINATOR_ERRORS)
            if not retriable or time.monotonic() + delay > deadline:
                raise RuntimeError(f"{what}: {err}") from e
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


@dataclass(frozen=True)
class Resolution:
    chosen: Checkpoint
    candidates: tuple[Checkpoint, ...]

    @property
    def disagreements(self) -> tuple[Checkpoint, ...]:
        return tuple(c for c in self.candidates if c.offset != self.chosen.offset)


def override_source(offset: int | None) -> CheckpointSource:
    return lambda: None if offset is None else Checkpoint(int(offset), OVERRIDE)


def kafka_committed_source(consumer: Consumer, tp: TopicPartition) -> CheckpointSource:
    """The group's committed offset, with done-beyond offsets from its commit metadata."""

    def read() -> Checkpoint | None:
        return committed_checkpoint(retry_retriable(
            lambda: consumer.committed([TopicPartition(tp.topic, tp.partition)], timeout=30)[0],
            f"reading the committed offset of {tp.topic}[{tp.partition}]",
        ))

    return read


def committed_checkpoint(committed: TopicPartition) -> Checkpoint | None:
    """The checkpoint of one partition as `Consumer.committed` answered for it, with the
    done-beyond offsets of its commit metadata."""
    if committed.error:
        raise RuntimeError(f"cannot read committed offset of {committed.topic}"
                           f"[{committed.partition}]: {committed.error}")
    if committed.offset < 0:
        return None
    done = OffsetTracker.decode_metadata(committed.offset, committed.metadata)
    return Checkpoint(committed.offset, KAFKA, frozenset(done))


def reset_source(
    consumer: Consumer,
    tp: TopicPartition,
    policy: str,
    watermarks: Callable[[], tuple[int, int]] | None = None,
) -> CheckpointSource:
    """`earliest` / `latest` (librdkafka's auto.offset.reset names) from the watermarks;
    `watermarks` gives them when the caller queries them anyway (one round trip, not two)."""

    def read() -> Checkpoint:
        if watermarks is not None:
            low, high = watermarks()
        else:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), timeout=30, cached=False
            )
        if policy in ("earliest", "smallest", "beginning"):
            return Checkpoint(low, RESET)
        if policy in ("latest", "largest", "end"):
            return Checkpoint(high, RESET)
        raise ValueError(f"auto.offset.reset {policy!r}: no checkpoint for {tp.topic}"
                         f"[{tp.partition}] and the reset policy does not allow starting")

    return read


def resolve_checkpoint(sources: Sequence[CheckpointSource], *, all_sources: bool = True
                       ) -> Resolution:
    """The first source with an answer wins. With `all_sources` (the default) every later
    source is read too, for the agreement check, and the done-beyond offsets of sources
    that agree with the winner's offset are merged into it (only Kafka's commit metadata
    carries them, but the changelog's transaction state ranks first)."""
    candidates: list[Checkpoint] = []
    for source in sources:
        cp = source()
        if cp is None:
            continue
        candidates.append(cp)
        if not all_sources:
            break
    if not candidates:
        raise RuntimeError("no checkpoint source answered (not even the reset policy)")
    first = candidates[0]
    done = frozenset().union(*(c.done_beyond for c in candidates if c.offset == first.offset))
    chosen = Checkpoint(first.offset, first.source, done)
    return Resolution(chosen, tuple(candidates))


def offset_for_timestamp(kafka_conf: dict, topic: str, partition: int, ts_ms: int) -> int:
    """The first offset at or after `ts_ms` (ms since the epoch), or the end offset when
    nothing is that recent: where a replay by time starts."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**kafka_conf, "group.id": "binlake-offsets-for-times"})
    try:
        found = consumer.offsets_for_times([TopicPartition(topic, partition, ts_ms)],
                                           timeout=30)[0]
        if found.offset >= 0:
            return found.offset
        return consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                              timeout=30, cached=False)[1]
    finally:
        consumer.close()


def disagreements(candidates: tuple[Checkpoint, ...], chosen: int) -> list[Checkpoint]:
    """The recorded checkpoints that differ from the offset a run chose. The reset
    policy's offset is where a partition starts when nothing is recorded, not a record of
    progress, so it never disagrees."""
    return [c for c in candidates if c.source != RESET and c.offset != chosen]
