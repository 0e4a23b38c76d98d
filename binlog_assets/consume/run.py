"""The bounded consumer run: one topic-partition, from its checkpoint to the end seen at start.

A run resolves its checkpoint, captures the partition's end offset (the last stable
offset under read_committed) before reading, and then loops on the poll thread: batch
`consume`, decode, hand events to the `LaneDispatcher`, feed done offsets to the
`OffsetTracker`, pause the partition when too much is in flight. It stops at the end
offset, at `max_records` or at `max_seconds`, drains the lanes, flushes dead letters and
commits the contiguous done offset synchronously, with done-beyond offsets in the commit
metadata so a rerun skips them. Nothing is committed past an event that is not done.
"""

from __future__ import annotations

import gc
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Protocol

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from binlog_assets.consume.checkpoint import (
    Checkpoint,
    CheckpointSource,
    Resolution,
    kafka_committed_source,
    override_source,
    reset_source,
    resolve_checkpoint,
    retry_retriable,
)
from binlog_assets.consume.deadletter import DeadLetter, DeadLetterPublisher
from binlog_assets.consume.errors import ErrorPolicy
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.lanes import LaneDispatcher
from binlog_assets.consume.offsets import OffsetTracker
from binlog_assets.faults import fault_point
from binlog_assets.formats.event import ChangeEvent, DecodeError

log = logging.getLogger(__name__)

STOP_END = "end_offset"
STOP_MAX_RECORDS = "max_records"
STOP_MAX_SECONDS = "max_seconds"


class StrictModeFailure(RuntimeError):
    """A strict run met a bad message; nothing past it was committed."""


class ContiguousSink(Protocol):
    """Receives, at each commit point, every event of the offsets below `end_offset` not
    yet given, in offset order, before Kafka's commit (the changelog writer)."""

    def __call__(self, events: list[ChangeEvent], raw: dict[int, bytes],
                 end_offset: int) -> None: ...


@dataclass(frozen=True)
class RunSettings:
    """What one bounded run needs besides the partition and its handlers."""

    kafka_conf: dict
    group_id: str
    format: str
    ordering: str = "key"
    table_ordering: dict[str, str] = field(default_factory=dict)
    lanes: int = 16
    workers: int | None = None  # threads serving the lanes; default min(lanes, 64)
    max_in_flight: int = 10_000
    error_policy: ErrorPolicy = field(default_factory=ErrorPolicy)
    dead_letter_topic: str | None = None
    max_records: int | None = None
    max_seconds: float | None = None
    start_offset: int | None = None  # explicit override, first in the precedence
    extra_checkpoint_sources: tuple[CheckpointSource, ...] = ()
    commit_interval_seconds: float = 5.0
    batch_size: int = 1000
    key_columns: dict[str, list[str]] | None = None


@dataclass
class RunSummary:
    topic: str
    partition: int
    start_offset: int
    checkpoint_source: str
    end_offset: int
    committed_offset: int
    records: int = 0
    events: int = 0
    skipped_already_done: int = 0
    dead_lettered: int = 0
    decode_dead_lettered: int = 0
    counts: Counter = field(default_factory=Counter)  # (table, op) -> events
    skipped: Counter = field(default_factory=Counter)  # decoder skip reason -> records
    seconds: float = 0.0
    stop_reason: str = STOP_END
    checkpoint_candidates: tuple[Checkpoint, ...] = ()

    @property
    def throughput(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def per_table(self) -> dict[str, int]:
        out: Counter = Counter()
        for (table, _op), n in self.counts.items():
            out[table] += n
        return dict(out)

    def per_op(self) -> dict[str, int]:
        out: Counter = Counter()
        for (_table, op), n in self.counts.items():
            out[op] += n
        return dict(out)


class BoundedRun:
    """Consume one topic-partition from its checkpoint up to the end offset seen at start."""

    def __init__(
        self,
        topic: str,
        partition: int,
        registry: HandlerRegistry,
        settings: RunSettings,
        *,
        decoder: object | None = None,
        on_commit: Callable[[int, str], None] | None = None,
        sink: ContiguousSink | None = None,
    ) -> None:
        from binlog_assets.formats import make_decoder

        self.tp = TopicPartition(topic, partition)
        self.registry = registry
        self.settings = settings
        self.decoder = decoder or make_decoder(settings.format, key_columns=settings.key_columns)
        self.on_commit = on_commit
        self.sink = sink
        # (offset, events, raw value) polled but not yet given to the sink.
        self._sink_buffer: deque[tuple[int, list[ChangeEvent], bytes | None]] = deque()
        self._sink_end: int | None = None
        self._dlq: DeadLetterPublisher | None = None
        self.peak_in_flight = 0
        self._tables_with_handlers: dict[str, bool] = {}

    # -- set-up -----------------------------------------------------------------------
    def _consumer(self) -> Consumer:
        conf = {
            **self.settings.kafka_conf,
            "group.id": self.settings.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
        }
        conf.setdefault("isolation.level", "read_committed")
        # librdkafka prefetches up to 100k messages per partition by default; a bounded
        # run holds at most max_in_flight events, so prefetching more only costs memory.
        conf.setdefault("queued.min.messages", max(1000, self.settings.max_in_flight))
        conf.setdefault("queued.max.messages.kbytes", 16384)
        # With a bounded queue, the default 1 s backoff when it is full idles the fetcher
        # after the run has long emptied it.
        conf.setdefault("fetch.queue.backoff.ms", 10)
        return Consumer(conf)

    def _resolve(self, consumer: Consumer) -> Resolution:
        policy = str(self.settings.kafka_conf.get("auto.offset.reset", "earliest"))
        sources: list[CheckpointSource] = [
            override_source(self.settings.start_offset),
            *self.settings.extra_checkpoint_sources,
            kafka_committed_source(consumer, self.tp),
            reset_source(consumer, self.tp, policy),
        ]
        return resolve_checkpoint(sources)

    def _dead_letters(self) -> DeadLetterPublisher:
        if self._dlq is None:
            topic = self.settings.dead_letter_topic or f"binlake.dlq.{self.tp.topic}"
            producer_conf = {k: v for k, v in self.settings.kafka_conf.items()
                             if k not in _CONSUMER_KEYS}
            self._dlq = DeadLetterPublisher(producer_conf, topic)
        return self._dlq

    # -- the run --------------------------------------------------------------------
    def run(self) -> RunSummary:
        began = time.monotonic()
        # Everything alive now (imported modules, Dagster's graph) lives for the whole
        # run: freezing it keeps the collector from rescanning it while events churn.
        gc.freeze()
        consumer = self._consumer()
        dispatcher: LaneDispatcher | None = None
        try:
            resolution = self._resolve(consumer)
            start = resolution.chosen
            _low, end = consumer.get_watermark_offsets(self.tp, timeout=30, cached=False)
            tracker = OffsetTracker(start.offset, start.done_beyond)
            self._sink_end = start.offset
            summary = RunSummary(
                self.tp.topic, self.tp.partition, start.offset, start.source, end,
                start.offset, checkpoint_candidates=resolution.candidates,
            )
            if start.offset >= end:
                summary.seconds = time.monotonic() - began
                return summary
            dispatcher = LaneDispatcher(
                self.registry,
                lanes=self.settings.lanes,
                workers=self.settings.workers,
                on_done_many=tracker.done_many,
                ordering=self.settings.ordering,
                table_ordering=self.settings.table_ordering or None,
                max_in_flight=self.settings.max_in_flight,
                policy=self.settings.error_policy,
                dead_letter=self._handler_dead_letter,
            )
            consumer.assign([TopicPartition(self.tp.topic, self.tp.partition, start.offset)])
            self._loop(consumer, dispatcher, tracker, summary, began)
            if summary.stop_reason == STOP_END:
                tracker.skip_to(summary.end_offset)
            # Keep committing while the lanes drain: a crash now loses no finished work.
            while (not dispatcher.drain(timeout=self.settings.commit_interval_seconds)
                   and dispatcher.failure is None):
                self._commit(consumer, tracker, summary)
            self._raise_if_strict_failed(dispatcher, consumer, tracker)
            self._commit(consumer, tracker, summary)
            summary.dead_lettered = summary.decode_dead_lettered + dispatcher.dead_lettered
            summary.skipped = Counter(self.decoder.skipped)
            summary.seconds = time.monotonic() - began
            return summary
        finally:
            if dispatcher is not None:
                dispatcher.close()
            consumer.close()
            gc.unfreeze()

    def _loop(self, consumer: Consumer, dispatcher: LaneDispatcher, tracker: OffsetTracker,
              summary: RunSummary, began: float) -> None:
        s = self.settings
        end = summary.end_offset
        paused = False
        last_commit = time.monotonic()
        next_offset = summary.start_offset
        while next_offset < end:
            if s.max_seconds is not None and time.monotonic() - began >= s.max_seconds:
                summary.stop_reason = STOP_MAX_SECONDS
                return
            if s.max_records is not None and summary.records >= s.max_records:
                summary.stop_reason = STOP_MAX_RECORDS
                return
            if dispatcher.failure is not None:
                return
            # Backpressure pauses this partition only; the poll loop keeps running.
            # Finished events wait in the sink buffer behind a slow one: count them too.
            buffered = len(self._sink_buffer) > 4 * s.max_in_flight
            if not paused and (dispatcher.is_full() or buffered):
                consumer.pause([self.tp])
                paused = True
            elif paused and dispatcher.below_low_water() and not buffered:
                consumer.resume([self.tp])
                paused = False
            # Never fetch more than fits under max_in_flight: memory stays bounded.
            # Never ask for more than is left before the end offset either: a short last
            # batch would otherwise wait out the whole consume timeout.
            want = max(1, min(s.batch_size, s.max_in_flight - dispatcher.in_flight(),
                              end - next_offset))
            if s.max_records is not None:
                want = min(want, s.max_records - summary.records)
            msgs = consumer.consume(num_messages=want, timeout=0.2 if paused else 1.0)
            if msgs:
                fault_point("after_fetch")
                next_offset = self._handle_batch(msgs, dispatcher, tracker, summary, end,
                                                 next_offset)
            elif not paused:
                # read_committed skips markers and aborted records: the position can pass
                # the last delivered offset without any message saying so.
                pos = consumer.position([self.tp])[0].offset
                if pos >= 0:
                    next_offset = max(next_offset, pos)
            # Commit on time, or early when finished events pile up for the changelog.
            if (time.monotonic() - last_commit >= s.commit_interval_seconds
                    or len(self._sink_buffer) >= 2 * s.max_in_flight):
                self._commit(consumer, tracker, summary)
                last_commit = time.monotonic()

    def _handle_batch(self, msgs: Sequence[Message], dispatcher: LaneDispatcher,
                      tracker: OffsetTracker, summary: RunSummary, end: int,
                      next_offset: int) -> int:
        decode = self.decoder.decode
        counts_update = summary.counts.update
        has_handlers = self._has_handlers
        events: list[ChangeEvent] = []
        received: list[int] = []
        done_now: list[int] = []
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    next_offset = max(next_offset, msg.offset())
                    continue
                raise RuntimeError(f"kafka error on {self.tp.topic}[{self.tp.partition}]: {err}")
            offset = msg.offset()
            if offset >= end:
                next_offset = end
                break
            next_offset = offset + 1
            received.append(offset)
            summary.records += 1
            already_done = tracker.is_already_done(offset)
            if already_done and self.sink is None:
                summary.skipped_already_done += 1
                done_now.append(offset)
                continue
            try:
                decoded = decode(msg.value(), topic=msg.topic(), partition=msg.partition(),
                                 offset=offset, key=msg.key(), headers=msg.headers())
            except DecodeError as e:
                self._decode_failed(msg, e, summary)
                done_now.append(offset)
                continue
            if self.sink is not None and decoded:
                self._sink_buffer.append((offset, decoded, msg.value()))
            if already_done:
                # Handled by an earlier run; the changelog still gets its events, since
                # that run's changelog write stopped at its contiguous point.
                summary.skipped_already_done += 1
                done_now.append(offset)
                continue
            if not decoded:
                done_now.append(offset)
                continue
            counts_update(map(_TABLE_OP, decoded))
            summary.events += len(decoded)
            if any(has_handlers(e.table) for e in decoded):
                # A record's events are done together: its offset completes when the last
                # of them is handled. The dispatcher tracks that per offset.
                events.extend(decoded)
            else:
                done_now.append(offset)  # no handler: the changelog is all it needs
        if received:
            tracker.received_many(received)
        if done_now:
            tracker.done_many(done_now)
        if events:
            dispatcher.submit_many(events)
            self.peak_in_flight = max(self.peak_in_flight, dispatcher.in_flight())
        return next_offset

    def _has_handlers(self, table: str) -> bool:
        known = self._tables_with_handlers.get(table)
        if known is None:
            known = self._tables_with_handlers[table] = bool(self.registry.handlers_for(table))
        return known

    # -- failures ---------------------------------------------------------------------
    def _decode_failed(self, msg: Message, error: DecodeError, summary: RunSummary) -> None:
        # Decoding is deterministic: retrying the same bytes gives the same error, so a
        # decode failure goes to the dead-letter topic at once (attempts=1).
        if self.settings.error_policy.strict:
            raise StrictModeFailure(
                f"undecodable message at {msg.topic()}[{msg.partition()}]@{msg.offset()}: "
                f"{error}"
            )
        log.warning("dead-lettering undecodable message %s[%d]@%d: %s",
                    msg.topic(), msg.partition(), msg.offset(), error)
        self._dead_letters().publish(DeadLetter(
            msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
            tuple(msg.headers() or ()), "decode", str(error), 1,
        ))
        summary.decode_dead_lettered += 1

    def _handler_dead_letter(self, event: ChangeEvent, error: BaseException,
                             attempts: int) -> None:
        self._dead_letters().publish(DeadLetter(
            event.topic, event.partition, event.offset, None,
            _event_bytes(event), (("binlake.table", event.table.encode()),),
            "handler", f"{type(error).__name__}: {error}", attempts,
        ))

    def _raise_if_strict_failed(self, dispatcher: LaneDispatcher, consumer: Consumer,
                                tracker: OffsetTracker) -> None:
        if dispatcher.failure is None:
            return
        # Commit what is contiguously done before the failure, then fail the run.
        self._commit(consumer, tracker, None)
        raise StrictModeFailure(
            f"handler failed in strict mode on {self.tp.topic}[{self.tp.partition}]; "
            f"committed up to {tracker.committable()}: {dispatcher.failure}"
        ) from dispatcher.failure

    # -- commit -----------------------------------------------------------------------
    def _flush_sink(self, end_offset: int) -> None:
        events: list[ChangeEvent] = []
        raw: dict[int, bytes] = {}
        buf = self._sink_buffer
        while buf and buf[0][0] < end_offset:
            offset, decoded, value = buf.popleft()
            events.extend(decoded)
            if value is not None:
                raw[offset] = value
        self.sink(events, raw, end_offset)
        self._sink_end = end_offset

    def _commit(self, consumer: Consumer, tracker: OffsetTracker,
                summary: RunSummary | None) -> None:
        if self._dlq is not None:
            self._dlq.flush()
        offset = tracker.committable()
        metadata = tracker.encode_metadata()
        if offset > (self._sink_end or 0):
            fault_point("after_handlers")
            if self.sink is not None:
                self._flush_sink(offset)
                fault_point("after_changelog_commit")
        target = [TopicPartition(self.tp.topic, self.tp.partition, offset, metadata=metadata)]
        retry_retriable(lambda: consumer.commit(offsets=target, asynchronous=False),
                        f"committing {self.tp.topic}[{self.tp.partition}]@{offset}")
        fault_point("after_kafka_commit")
        if summary is not None:
            summary.committed_offset = offset
        if self.on_commit is not None:
            self.on_commit(offset, metadata)


_TABLE_OP = attrgetter("table", "op")


def _event_bytes(event: ChangeEvent) -> bytes:
    import orjson

    return orjson.dumps(
        {"table": event.table, "op": event.op, "key": list(event.key), "before": event.before,
         "after": event.after, "position": list(event.position)},
        default=str,
    )


_CONSUMER_KEYS = frozenset({
    "group.id", "group.instance.id", "auto.offset.reset", "enable.auto.commit",
    "enable.auto.offset.store", "isolation.level", "session.timeout.ms",
    "max.poll.interval.ms", "heartbeat.interval.ms", "fetch.min.bytes", "fetch.max.bytes",
    "fetch.wait.max.ms", "max.partition.fetch.bytes", "enable.partition.eof",
})
