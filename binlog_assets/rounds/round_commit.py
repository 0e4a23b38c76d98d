"""A round's partitions committed together: the changelog follower's round (and any run
of many partitions that asks for it) reads what every partition needs to start in one
request each, and makes their last commit points in one changelog commit per source and
one Kafka commit, instead of a Delta commit, a coordinator lookup and a Kafka commit per
partition (bench/RESULTS.md, "A changelog follower round").

Each partition still commits exactly what it would have committed alone, in the same
order: its run reads to its end and hands its last commit point over (`BoundedRun`'s
`hold`); then the changelog commit carries every held partition's rows and its own
transaction (group/topic/partition -> end offset), each range checked by its fence under
its partition's lock (`fence.write_together`); then Kafka's commit carries the offsets of
the partitions whose rows are in, and only then does a partition's summary say it
committed. A partition fenced, or whose Kafka commit failed, gets its error and the others
go on; one whose commits never happened is read again by the next run from its checkpoint.
Commit points a run makes on its way (a long partition) are its own, as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, TopicPartition

from binlog_assets.consume.checkpoint import Checkpoint, committed_checkpoint, retry_retriable
from binlog_assets.consume.kafka_commit import Committer
from binlog_assets.consume.lag import lag_consumer
from binlog_assets.consume.run_settings import LastCommitHold
from binlog_assets.consume.runtime import timed
from binlog_assets.faults import fault_point
from binlog_assets.formats.event import ChangeEvent
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.lakehouse.fence import FencedChangelogSink, SinkRange, write_together
from binlog_assets.rounds.partition import PartitionOutcome

if TYPE_CHECKING:
    from binlog_assets.rounds.plan import RunPlan


@dataclass
class Held:
    """A partition's last commit point, handed over by its run."""

    source: str
    sink: FencedChangelogSink
    events: list[ChangeEvent]
    raw: dict[int, bytes]
    offset: int
    metadata: str


class RoundCommit:
    """The start and the last commit of a round's partitions, each done once for all."""

    def __init__(self, kafka_conf: dict, group: str, writer: ChangelogWriter,
                 commit_timeout_seconds: float) -> None:
        self.kafka_conf, self.group, self.writer = kafka_conf, group, writer
        self.timeout = commit_timeout_seconds
        self.consumer: Consumer | None = None  # opened by `read_checkpoints`
        self.changelog: dict[tuple[str, int], int | None] = {}
        self.kafka: dict[tuple[str, int], Checkpoint | Exception | None] = {}
        self.held: dict[str, Held] = {}
        self._lock = threading.Lock()
        self._abandoned = False
        # The longest of its reads and commits: every partition of the round waited on it.
        self.kafka_wait_seconds = 0.0

    def read_checkpoints(self, partitions: Sequence[tuple[str, int]]) -> None:
        """The changelog's checkpoint of every partition (one look at its log) and the
        group's committed offsets (one request), through the consumer that makes the
        round's Kafka commit."""
        self.consumer = consumer = lag_consumer(self.kafka_conf, self.group)
        self.changelog = self.writer.checkpoints(self.group, partitions)
        answered, waited = timed(lambda: retry_retriable(
            lambda: consumer.committed([TopicPartition(t, p) for t, p in partitions],
                                       timeout=30),
            f"reading committed offsets of group {self.group}"))
        self.kafka_wait_seconds = max(self.kafka_wait_seconds, waited)
        for tp in answered:
            try:
                self.kafka[(tp.topic, tp.partition)] = committed_checkpoint(tp)
            except RuntimeError as exc:  # that partition's run fails with it, alone
                self.kafka[(tp.topic, tp.partition)] = exc

    def kafka_checkpoint(self, topic: str, partition: int) -> Checkpoint | None:
        """The group's committed offset of the partition, as `read_checkpoints` found it."""
        found = self.kafka[(topic, partition)]
        if isinstance(found, Exception):
            raise found
        return found

    def hold(self, key: str, source: str, sink: FencedChangelogSink) -> LastCommitHold:
        """What the run of `key` hands its last commit point to."""
        def held(events: list[ChangeEvent], raw: dict[int, bytes], offset: int,
                 metadata: str) -> None:
            with self._lock:
                self.held[key] = Held(source, sink, events, raw, offset, metadata)
        return held

    def commit(self, keys: Sequence[str]) -> dict[str, int | BaseException]:
        """The held commit points of `keys` (those whose runs ended well), each its
        committed offset or the error that stopped its commit."""
        with self._lock:
            held = {key: self.held.pop(key) for key in keys if key in self.held}
        if not held:
            return {}
        fault_point("after_handlers")
        outcome: dict[str, int | BaseException] = {}
        by_source: dict[str, list[str]] = {}
        for key, h in held.items():
            by_source.setdefault(h.source, []).append(key)
        # One commit per source: a commit's tag names its first partition, and readers
        # take every row of the commit for that partition's source.
        for source_keys in by_source.values():
            ranges: list[SinkRange] = [(held[k].sink, held[k].events, held[k].raw,
                                        held[k].offset) for k in source_keys]
            try:
                errors = write_together(ranges)
            except Exception as exc:  # the commit failed: none of these partitions wrote
                errors = [exc] * len(source_keys)
            outcome.update((k, e) for k, e in zip(source_keys, errors, strict=True)
                           if e is not None)
        fault_point("after_changelog_commit")
        into_kafka = [k for k in held if k not in outcome]
        outcome.update(self._commit_kafka({k: held[k] for k in into_kafka}))
        fault_point("after_kafka_commit")
        return {k: outcome.get(k, held[k].offset) for k in held}

    def _commit_kafka(self, held: Mapping[str, Held]) -> dict[str, BaseException]:
        if not held:
            return {}
        if self._abandoned:
            error = RuntimeError("an earlier commit of the round's consumer is still stuck")
            return dict.fromkeys(held, error)
        offsets = [TopicPartition(h.sink.topic, h.sink.partition, h.offset,
                                  metadata=h.metadata) for h in held.values()]
        committer = Committer(self.consumer, self.timeout)
        began = time.monotonic()  # timed by hand: a commit that raises waited too
        try:
            answered = committer.commit(offsets, f"committing {len(offsets)} partitions")
        except Exception as exc:
            self._abandoned = committer.abandoned
            return dict.fromkeys(held, exc)
        finally:
            self.kafka_wait_seconds = max(self.kafka_wait_seconds, time.monotonic() - began)
        failed = {(tp.topic, tp.partition): tp.error for tp in answered if tp.error}
        errors: dict[str, BaseException] = {}
        for key, h in held.items():
            error = failed.get((h.sink.topic, h.sink.partition))
            if error is not None:
                errors[key] = RuntimeError(f"committing {h.sink.topic}[{h.sink.partition}]"
                                           f"@{h.offset}: {error}")
        return errors

    def close(self) -> None:
        # A commit that is stuck still holds the consumer: its thread closes it.
        if self.consumer is not None and not self._abandoned:
            self.consumer.close()


def open_round(plan: RunPlan, opened: ExitStack) -> RoundCommit | Exception | None:
    """The run's `RoundCommit`, its checkpoints read, closed with `opened`; the error
    that kept it from reading them; None when no partition has a source to run."""
    plans = plan.planned()
    if not plans:
        return None
    first = plans[0]
    round_ = RoundCommit(plan.kafka_conf, plan.group, first.writer,
                         first.settings.commit_timeout_seconds)
    opened.callback(round_.close)
    try:
        round_.read_checkpoints([(p.topic, p.partition) for p in plans])
    except Exception as exc:
        return exc
    return round_


def commit_round(round_: RoundCommit | None, done: dict[str, PartitionOutcome]) -> None:
    """The held commit points of the partitions that ran to their end, made together;
    each outcome then says what its partition committed, or the error that stopped it."""
    if round_ is None:
        return
    ended = [key for key, o in done.items() if o.error is None and o.summary is not None]
    for key, result in round_.commit(ended).items():
        if isinstance(result, BaseException):
            done[key] = PartitionOutcome(key, error=result)
        else:
            summary = done[key].summary
            summary.committed_offset = result
            summary.kafka_wait_seconds = max(summary.kafka_wait_seconds,
                                             round_.kafka_wait_seconds)
