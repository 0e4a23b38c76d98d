"""The bounded consumer run: one topic-partition, from its checkpoint to the end seen at start.

A run resolves its checkpoint, captures the partition's end offset (the last stable
offset under read_committed) before reading, and then loops on the poll thread: batch
`consume`, decode, hand events to the `LaneDispatcher`, feed done offsets to the
`OffsetTracker`, pause the partition when too much is in flight. It stops at the end
offset, at `max_records` or at `max_seconds`, drains the lanes, flushes dead letters and
commits the contiguous done offset synchronously, with done-beyond offsets in the commit
metadata so a rerun skips them. Nothing is committed past an event that is not done.
Asked to stop (its `stop` set), it lets the handlers finish only the events they are
running, and commits what is then contiguous.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from binlog_assets.consume import defaults
from binlog_assets.consume.checkpoint import (
    OVERRIDE,
    CheckpointSource,
    Resolution,
    kafka_committed_source,
    override_source,
    reset_source,
    resolve_checkpoint,
)
from binlog_assets.consume.deadletter import DeadLetter, DeadLetterPublisher, event_bytes
from binlog_assets.consume.errors import (
    DispatcherStopped,
    StrictModeFailure,
    dead_letter_reason,
    failed_handlers,
    partition_stopped,
    stops_partition,
)
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.kafka_commit import Committer
from binlog_assets.consume.lanes import DispatchOptions, LaneDispatcher
from binlog_assets.consume.lineage import MemoryBook, Placer
from binlog_assets.consume.offsets import OffsetTracker
from binlog_assets.consume.run_settings import RunParts, RunSettings
from binlog_assets.consume.runtime import (
    CONSUMER_KEYS,
    Started,
    consumer_defaults,
    raise_gc_threshold,
    restore_gc_threshold,
    timed,
    yield_gil,
)
from binlog_assets.consume.snapshot_end import nothing_covered, snapshot_ends
from binlog_assets.consume.summary import (
    STOP_AT_RECORD,
    STOP_END,
    STOP_INTERRUPTED,
    STOP_MAX_RECORDS,
    STOP_MAX_SECONDS,
    STOP_SNAPSHOT_PENDING,
    RunSummary,
)
from binlog_assets.faults import fault_point
from binlog_assets.formats.event import (
    ChangeEvent,
    DecodeError,
    SnapshotPending,
    SourceUnavailableError,
)

log = logging.getLogger(__name__)

# While the lanes drain, how often the run looks at its `stop`.
_STOP_CHECK_SECONDS = 0.2
# Records asked for by a run's first consume; each later batch doubles up to batch_size.
_FIRST_BATCH = 64
# While handlers wait on I/O, the poll thread yields the GIL after this many records.
_YIELD_EVERY = 16


@dataclass(slots=True)
class _Poll:
    """What the poll thread's loop and its batch handling share during one run."""

    consumer: Consumer
    dispatcher: LaneDispatcher
    tracker: OffsetTracker
    summary: RunSummary
    began: float
    next_offset: int  # the next offset to read
    halt: tuple[BaseException, int] | None = None  # the decode error it stopped at, where


class BoundedRun:
    """Consume one topic-partition from its checkpoint up to the end offset seen at start."""

    def __init__(self, topic: str, partition: int, registry: HandlerRegistry,
                 settings: RunSettings, parts: RunParts | None = None) -> None:
        from binlog_assets.formats import make_decoder

        parts = parts or RunParts()
        self.tp = TopicPartition(topic, partition)
        self.registry = registry
        self.settings = settings
        self.decoder = parts.decoder or make_decoder(
            settings.format, key_columns=settings.key_columns,
            schema_registry=settings.schema_registry)
        self.sink = parts.sink
        self.stop, self.hold = parts.stop, parts.hold
        # Each event's lineage in its source (`consume/lineage.py`); without a changelog
        # to keep the source's lineages in, they live as long as the run.
        self.placer = parts.placer or Placer(MemoryBook(), f"{topic}[{partition}]")
        self.covered = parts.covered or nothing_covered
        # (offset, events, raw value) polled but not yet given to the sink.
        self._sink_buffer: deque[tuple[int, list[ChangeEvent], bytes | None]] = deque()
        self._sink_end: int | None = None
        self._dlq: DeadLetterPublisher | None = None
        # Lanes dead-letter from their own threads: the publisher is created once.
        self._dlq_lock = threading.Lock()
        self.peak_in_flight = 0
        self._tables_with_handlers: dict[str, bool] = {}
        self._committer: Committer | None = None  # the run's consumer's

    # -- set-up -----------------------------------------------------------------------
    def _consumer(self) -> Consumer:
        conf = {
            **consumer_defaults(self.settings.max_in_flight),
            **self.settings.kafka_conf,
            "group.id": self.settings.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
        }
        conf.setdefault("isolation.level", "read_committed")
        return Consumer(conf)

    def _resolve(self, consumer: Consumer,
                 watermarks: Callable[[], tuple[int, int]] | None = None) -> Resolution:
        policy = str(self.settings.kafka_conf.get("auto.offset.reset", "earliest"))
        sources: list[CheckpointSource] = [
            override_source(self.settings.start_offset),
            *self.settings.extra_checkpoint_sources,
            self.settings.kafka_checkpoint or kafka_committed_source(consumer, self.tp),
            reset_source(consumer, self.tp, policy, watermarks),
        ]
        return resolve_checkpoint(sources)

    def _dead_letters(self) -> DeadLetterPublisher:
        with self._dlq_lock:
            if self._dlq is None:
                topic = (self.settings.dead_letter_topic
                         or defaults.dead_letter_topic(self.settings.source))
                producer_conf = {k: v for k, v in self.settings.kafka_conf.items()
                                 if k not in CONSUMER_KEYS}
                self._dlq = DeadLetterPublisher(producer_conf, topic)
            return self._dlq

    # -- the run --------------------------------------------------------------------
    def run(self) -> RunSummary:
        began = time.monotonic()
        raise_gc_threshold()
        consumer: Consumer | None = None
        dispatcher: LaneDispatcher | None = None
        starting: Started | None = None
        try:
            s = self.settings
            # The run's fixed start-up is three waits that do not depend on each other:
            # the checkpoint (a round trip to the group coordinator), the end offset (one
            # to the partition leader) and the lane workers' threads. They overlap.
            starting = Started(self._dispatcher)
            consumer = self._consumer()
            watermarks = Started(lambda: timed(
                lambda: consumer.get_watermark_offsets(self.tp, timeout=30, cached=False)))
            resolution = self._resolve(consumer, lambda: watermarks.result()[0])
            start = resolution.chosen
            (_low, end), waited = watermarks.result()
            tracker = OffsetTracker(start.offset, start.done_beyond)
            self._sink_end = start.offset
            summary = RunSummary(
                self.tp.topic, self.tp.partition, start.offset, start.source, end,
                start.offset, checkpoint_candidates=resolution.candidates,
                kafka_wait_seconds=waited,
            )
            dispatcher = starting.result()
            dispatcher.report_done_to(tracker.done_many)
            if start.offset >= end:
                if start.source == OVERRIDE:
                    # Run from past every record (a record skipped on purpose, say): the
                    # checkpoints move there, or the next run would read it again.
                    self._commit(consumer, tracker, summary, skipping=True)
                summary.seconds = time.monotonic() - began
                return summary
            consumer.assign([TopicPartition(self.tp.topic, self.tp.partition, start.offset)])
            poll = _Poll(consumer, dispatcher, tracker, summary, began, start.offset)
            self._loop(poll)
            if summary.stop_reason != STOP_INTERRUPTED:
                self._drain(consumer, dispatcher, tracker, summary)
            if summary.stop_reason == STOP_INTERRUPTED:
                # Events not started are dropped (the next run reads them again); the
                # workers finish what they run and report it as they exit.
                dispatcher.close(timeout=s.handler_timeout_seconds or 10.0)
            self._commit(consumer, tracker, summary, final=poll.halt is None
                         and summary.stop_reason != STOP_INTERRUPTED)
            return self._ended(poll, dispatcher, summary, began)
        finally:
            if dispatcher is None and starting is not None:
                dispatcher = starting.result(raise_error=False)
            if dispatcher is not None:
                dispatcher.close()
            # A consumer with a commit stuck past its deadline is the commit thread's to close.
            committer = self._committer
            if consumer is not None and not (committer is not None and committer.abandoned
                                             and committer.consumer is consumer):
                consumer.close()
            # The run is garbage in a cycle once it returns (its lanes call back into it),
            # which only a full collection frees, rare in a long-lived process: its clients
            # must not wait for it, each holds one of the process's 1,024 thread-local keys.
            self._committer = self._dlq = None
            restore_gc_threshold()

    def _dispatcher(self) -> LaneDispatcher:
        s = self.settings
        options = DispatchOptions(
            slots=s.lanes * s.key_slots_per_lane,
            workers=s.workers or defaults.default_workers(s.lanes),
            ordering=s.ordering,
            table_ordering=s.table_ordering or None,
            max_in_flight=s.max_in_flight,
            handler_timeout_seconds=s.handler_timeout_seconds,
        )
        return LaneDispatcher(self.registry, options, policy=s.error_policy,
                              dead_letter=self._handler_dead_letter)

    def _ended(self, poll: _Poll, dispatcher: LaneDispatcher, summary: RunSummary,
               began: float) -> RunSummary:
        """The summary of a run whose last commit is made; raises where it stopped at a
        record it could not decode."""
        if poll.halt is not None and isinstance(poll.halt[0], SnapshotPending):
            log.info("%s[%d] ends before offset %d: %s", self.tp.topic, self.tp.partition,
                     poll.halt[1], poll.halt[0])
            summary.stop_reason = STOP_SNAPSHOT_PENDING
        elif poll.halt is not None:
            # What came before the record is committed; the record and all after it
            # wait for the next run.
            raise partition_stopped(poll.halt[0], self.tp.topic, self.tp.partition,
                                    poll.halt[1], summary.committed_offset)
        summary.lineage = self.placer.lineage
        summary.lineages_raised = [r.describe() for r in self.placer.raised]
        summary.dead_lettered = summary.decode_dead_lettered + dispatcher.dead_lettered
        summary.breakers_open = dispatcher.breakers_open
        summary.handlers = dispatcher.handler_metrics()
        summary.skipped = Counter(self.decoder.skipped)
        summary.seconds = time.monotonic() - began
        return summary

    def _stopping(self, summary: RunSummary) -> bool:
        if self.stop is not None and self.stop.is_set():
            summary.stop_reason = STOP_INTERRUPTED
            return True
        return False

    def _drain(self, consumer: Consumer, dispatcher: LaneDispatcher,
               tracker: OffsetTracker, summary: RunSummary) -> None:
        dispatcher.finishing()
        if summary.stop_reason == STOP_END:
            tracker.skip_to(summary.end_offset)
        # Keep committing while the lanes drain: a crash now loses no finished work.
        last_commit = time.monotonic()
        while (not dispatcher.drain(timeout=_STOP_CHECK_SECONDS)
               and dispatcher.failure is None):
            if self._stopping(summary):
                return
            if time.monotonic() - last_commit >= self.settings.commit_interval_seconds:
                self._commit(consumer, tracker, summary)
                last_commit = time.monotonic()
        self._raise_if_strict_failed(dispatcher, consumer, tracker)
        if dispatcher.in_flight() == 0:
            dispatcher.stop()  # idle: its threads exit while the commit is in flight

    def _loop(self, poll: _Poll) -> None:
        s = self.settings
        consumer, dispatcher, summary = poll.consumer, poll.dispatcher, poll.summary
        end = summary.end_offset
        paused = False
        last_commit = time.monotonic()
        ramp = min(_FIRST_BATCH, s.batch_size)
        stalled_since: float | None = None
        while poll.next_offset < end:
            if s.max_seconds is not None and time.monotonic() - poll.began >= s.max_seconds:
                summary.stop_reason = STOP_MAX_SECONDS
                return
            if s.max_records is not None and summary.records >= s.max_records:
                summary.stop_reason = STOP_MAX_RECORDS
                return
            if dispatcher.failure is not None:
                return
            if self._stopping(summary):
                return
            # Finished events wait in the sink buffer behind a slow one: when too many do,
            # the partition is paused; the poll loop keeps running and committing.
            buffered = len(self._sink_buffer) > 4 * s.max_in_flight
            if not paused and buffered:
                consumer.pause([self.tp])
                paused = True
            elif paused and not buffered:
                consumer.resume([self.tp])
                paused = False
            # At max_in_flight the loop waits for the lanes to come down to the low-water
            # mark, and wakes the moment they do. It does not pause the partition for
            # that: a pause discards librdkafka's prefetched records (bounded anyway by
            # consumer_defaults), and a consume timeout on a paused partition idled the
            # run for up to 0.2 s after the lanes had drained.
            full = dispatcher.is_full() and not dispatcher.wait_below_low_water(0.2)
            # Never fetch more than fits under max_in_flight: memory stays bounded.
            # Never ask for more than is left before the end offset either: a short last
            # batch would otherwise wait out the whole consume timeout.
            # The first batches are small and double up to batch_size, so the lanes get
            # work after a few records are decoded rather than after a whole batch.
            want = max(1, min(ramp, s.max_in_flight - dispatcher.in_flight(),
                              end - poll.next_offset))
            ramp = min(2 * ramp, s.batch_size)
            if s.max_records is not None:
                want = min(want, s.max_records - summary.records)
            asked = time.monotonic()
            msgs = [] if full else consumer.consume(num_messages=want,
                                                    timeout=0.2 if paused else 1.0)
            # Empty fetches in a row with records left below the end: Kafka is not
            # delivering them (a frozen or restarting broker), however long it takes.
            if msgs or paused or full:
                stalled_since = None
            else:
                stalled_since = asked if stalled_since is None else stalled_since
                summary.kafka_wait_seconds = max(summary.kafka_wait_seconds,
                                                 time.monotonic() - stalled_since)
            if msgs:
                fault_point("after_fetch")
                self._handle_batch(poll, msgs)
                if poll.halt is not None:
                    summary.stop_reason = STOP_AT_RECORD  # never skip_to the end: see _drain
                    return
            elif not paused and not full:
                # read_committed skips markers and aborted records: the position can pass
                # the last delivered offset without any message saying so.
                pos = consumer.position([self.tp])[0].offset
                if pos >= 0:
                    poll.next_offset = max(poll.next_offset, pos)
            # Commit on time, or early when finished events pile up for the changelog.
            if (time.monotonic() - last_commit >= s.commit_interval_seconds
                    or len(self._sink_buffer) >= 2 * s.max_in_flight):
                self._commit(consumer, poll.tracker, summary)
                last_commit = time.monotonic()

    def _handle_batch(self, poll: _Poll, msgs: Sequence[Message]) -> None:
        """Decode `msgs` and hand their events to the lanes; returns the next offset.
        While handlers wait on I/O the batch goes in slices of _YIELD_EVERY records and
        the poll thread yields the GIL after each: decoding holds it, and a worker back
        from its I/O needs it to finish. Cheap handlers keep whole batches, and so does
        a run with no handler (a changelog-only run): no worker waits for the GIL then."""
        dispatcher = poll.dispatcher
        if (len(msgs) <= _YIELD_EVERY or not len(self.registry)
                or not dispatcher.handlers_wait()):
            self._handle_slice(poll, msgs)
            return
        for start in range(0, len(msgs), _YIELD_EVERY):
            self._handle_slice(poll, msgs[start:start + _YIELD_EVERY])
            if poll.next_offset >= poll.summary.end_offset or poll.halt is not None:
                break
            if dispatcher.in_flight():  # else no worker has anything to finish
                yield_gil()

    def _handle_slice(self, poll: _Poll, msgs: Sequence[Message]) -> None:
        # The poll thread is the run's bottleneck when handlers are cheap, so the per-record
        # work here is kept to the minimum; counting and lookups happen once per call (a
        # whole batch, or a slice of one while handlers wait).
        decode = self.decoder.decode
        place = self.placer.place
        ended = self.decoder.snapshots_ended  # filled in place by the decoder
        tracker, summary, next_offset = poll.tracker, poll.summary, poll.next_offset
        end = summary.end_offset
        topic, partition = self.tp.topic, self.tp.partition
        handled_tables = self._tables_with_handlers
        has_handlers = self._has_handlers
        sink = self.sink
        events: list[ChangeEvent] = []
        counted: list[ChangeEvent] = []  # decoded events of records not done before
        received: list[int] = []
        done_now: list[int] = []
        # Offsets an earlier run finished (commit metadata): usually there are none.
        is_already_done = tracker.is_already_done if tracker.has_prior() else None
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
            already_done = is_already_done is not None and is_already_done(offset)
            if already_done and sink is None:
                summary.skipped_already_done += 1
                done_now.append(offset)
                continue
            try:
                decoded = decode(msg.value(), topic=topic, partition=partition,
                                 offset=offset, key=msg.key(), headers=msg.headers())
                for event in decoded:
                    place(event)
                if ended:
                    decoded = self._snapshot_ends(decoded, ended)
            except (DecodeError, SourceUnavailableError) as e:
                if stops_partition(e, self.settings.error_policy.strict):
                    received.pop()  # never received: nothing at or past it is committed
                    next_offset = offset
                    poll.halt = (e, offset)
                    break
                self._decode_failed(msg, e, summary)
                done_now.append(offset)
                continue
            if sink is not None and decoded:
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
            counted += decoded
            if len(decoded) == 1:
                table = decoded[0].table
                handled = handled_tables.get(table)
                if handled is None:
                    handled = has_handlers(table)
            else:
                handled = any(has_handlers(e.table) for e in decoded)
            if handled:
                # A record's events are done together: its offset completes when the last
                # of them is handled. The dispatcher tracks that per offset.
                events += decoded
            else:
                done_now.append(offset)  # no handler: the changelog is all it needs
        self._hand_over(poll, received, done_now, counted, events)
        poll.next_offset = next_offset

    def _hand_over(self, poll: _Poll, received: list[int], done_now: list[int],
                   counted: list[ChangeEvent], events: list[ChangeEvent]) -> None:
        """A slice's records to the tracker and the summary, its events to the lanes:
        once a slice, after its per-record loop."""
        summary, tracker = poll.summary, poll.tracker
        summary.records += len(received)
        if counted:
            summary.events += len(counted)
            summary.counts.update(map(_TABLE_OP, counted))
        if received:
            tracker.received_many(received)
        if done_now:
            tracker.done_many(done_now)
        if events:
            try:
                poll.dispatcher.submit_many(events)
            except DispatcherStopped:
                # A lane failed in strict mode since the loop looked: these records stay
                # received and not done, and the loop ends on the failure (`_drain`).
                if poll.dispatcher.failure is None:
                    raise
            self.peak_in_flight = max(self.peak_in_flight, poll.dispatcher.in_flight())

    def _snapshot_ends(self, decoded: list[ChangeEvent], ended: list) -> list[ChangeEvent]:
        """The record's events and the ends of the tables the snapshots it ended read."""
        try:
            events = snapshot_ends(decoded, ended, self.covered)
        finally:
            ended.clear()
        for event in events[len(decoded):]:
            self.placer.place(event)
        return events

    def _has_handlers(self, table: str) -> bool:
        known = self._tables_with_handlers.get(table)
        if known is None:
            known = self._tables_with_handlers[table] = bool(self.registry.handlers_for(table))
        return known

    # -- failures ---------------------------------------------------------------------
    def _decode_failed(self, msg: Message, error: DecodeError, summary: RunSummary) -> None:
        # Decoding is deterministic: retrying the same bytes gives the same error, so a
        # decode failure goes to the dead-letter topic at once (attempts=1).
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
            event_bytes(event), (("binlake.table", event.table.encode()),
                                  ("binlake.handler", ",".join(failed_handlers(error)).encode()),
                                  ("binlake.reason", dead_letter_reason(error).encode())),
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
            f"committed up to {tracker.committable()} ({tracker.pending_count()} records "
            f"received and not done): {dispatcher.failure}"
        ) from dispatcher.failure

    # -- commit -----------------------------------------------------------------------
    def _sink_range(self, end_offset: int) -> tuple[list[ChangeEvent], dict[int, bytes]]:
        events: list[ChangeEvent] = []
        raw: dict[int, bytes] = {}
        buf = self._sink_buffer
        while buf and buf[0][0] < end_offset:
            offset, decoded, value = buf.popleft()
            events.extend(decoded)
            if value is not None:
                raw[offset] = value
        return events, raw

    def _flush_sink(self, end_offset: int) -> None:
        self.sink(*self._sink_range(end_offset), end_offset)
        self._sink_end = end_offset

    def _commit(self, consumer: Consumer, tracker: OffsetTracker,
                summary: RunSummary | None, *, final: bool = False,
                skipping: bool = False) -> None:
        # What to commit is read first, then the dead letters are flushed: an event a lane
        # dead-letters and marks done after this read is not committed past, so every
        # dead letter below the commit has been acknowledged by the broker.
        offset, metadata = tracker.commit_point()
        if self._dlq is not None:
            self._dlq.flush()
        if final and self.hold is not None:  # the caller commits it (`LastCommitHold`)
            self.hold(*self._sink_range(offset), offset, metadata)
            return
        if offset > (self._sink_end or 0) or (skipping and self.sink is not None):
            fault_point("after_handlers")
            if self.sink is not None:
                self._flush_sink(offset)
                fault_point("after_changelog_commit")
        target = [TopicPartition(self.tp.topic, self.tp.partition, offset, metadata=metadata)]
        if self._committer is None or self._committer.consumer is not consumer:
            self._committer = Committer(consumer, self.settings.commit_timeout_seconds)
        _answer, waited = timed(lambda: self._committer.commit(
            target, f"committing {self.tp.topic}[{self.tp.partition}]@{offset}"))
        fault_point("after_kafka_commit")
        if summary is not None:
            summary.committed_offset = offset
            summary.kafka_wait_seconds = max(summary.kafka_wait_seconds, waited)


_TABLE_OP = attrgetter("table", "op")
