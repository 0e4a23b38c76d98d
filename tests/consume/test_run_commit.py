"""A run's commit step: what it commits is read at one moment, before dead letters are
flushed, and the dead-letter publisher exists once however many lanes ask at once.

No broker: a fake consumer records the commits and a fake publisher records which dead
letters the broker has acknowledged; a lane's work is simulated at the exact moment a
race would let it in.
"""

from __future__ import annotations

import threading
import time

from binlog_assets.consume import run as run_module
from binlog_assets.consume.deadletter import DeadLetter
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.offsets import OffsetTracker
from binlog_assets.consume.run import BoundedRun, RunSettings


class RecordingConsumer:
    def __init__(self) -> None:
        self.commits: list[tuple[int, str]] = []

    def commit(self, offsets, asynchronous: bool) -> None:
        assert not asynchronous
        (tp,) = offsets
        self.commits.append((tp.offset, tp.metadata))


class AckingPublisher:
    """Dead letters are queued at `publish` and acknowledged by `flush`; `after_flush`
    plays a lane that dead-letters (and so finishes) an event just after a flush."""

    def __init__(self) -> None:
        self.queued: set[int] = set()
        self.acknowledged: set[int] = set()
        self.after_flush = None

    def publish(self, offset: int) -> None:
        self.queued.add(offset)

    def flush(self) -> None:
        self.acknowledged |= self.queued
        self.queued.clear()
        if self.after_flush is not None:
            action, self.after_flush = self.after_flush, None
            action()


def _run() -> BoundedRun:
    return BoundedRun("t", 0, HandlerRegistry(),
                      RunSettings(kafka_conf={}, group_id="g", format="debezium"))


def test_no_commit_passes_a_dead_letter_the_broker_has_not_acknowledged() -> None:
    run, consumer, dlq = _run(), RecordingConsumer(), AckingPublisher()
    run._dlq = dlq
    tracker = OffsetTracker(0)
    tracker.received_many([0, 1, 2])
    tracker.done_many([0, 2])

    def lane_dead_letters_offset_1() -> None:
        dlq.publish(1)
        tracker.done(1)

    dlq.after_flush = lane_dead_letters_offset_1
    run._commit(consumer, tracker, None)
    (committed, _metadata), = consumer.commits
    # Offset 1's dead letter is still only queued: the commit must stay at or below it.
    assert committed <= 1 and 1 in dlq.queued
    # The next commit, after the next flush, passes it.
    run._commit(consumer, tracker, None)
    assert consumer.commits[-1][0] == 3 and 1 in dlq.acknowledged


class RacingTracker(OffsetTracker):
    """Finishes the head offset (another lane) as soon as the run asks a second question
    in one commit step: a read split in two sees two moments."""

    def __init__(self, start: int) -> None:
        super().__init__(start)
        self.asked = 0

    def _asked(self) -> None:
        self.asked += 1
        if self.asked == 2:
            self.done(0)

    def committable(self) -> int:
        self._asked()
        return super().committable()

    def encode_metadata(self, max_bytes: int = 4000) -> str:
        self._asked()
        return super().encode_metadata(max_bytes)

    def commit_point(self, max_bytes: int = 4000) -> tuple[int, str]:
        self._asked()
        return super().commit_point(max_bytes)


def test_the_committed_offset_and_its_metadata_come_from_one_moment() -> None:
    run, consumer = _run(), RecordingConsumer()
    tracker = RacingTracker(0)
    tracker.received_many([0, 1, 2, 3])
    tracker.done_many([2, 3])  # done beyond the head: the metadata carries them
    run._commit(consumer, tracker, None)
    (committed, metadata), = consumer.commits
    # The metadata must be the one written for the committed offset, or the next run
    # discards it and redoes 2 and 3.
    assert OffsetTracker.decode_metadata(committed, metadata) == ({2, 3} if committed == 0
                                                                   else set())
    assert metadata.startswith(f"o1:{committed}:") or metadata == ""


def test_lanes_dead_lettering_at_once_share_one_publisher(monkeypatch) -> None:
    made: list[object] = []

    class SlowPublisher:
        def __init__(self, conf: dict, topic: str) -> None:
            time.sleep(0.05)  # a real Producer takes a while to build
            made.append(self)

    monkeypatch.setattr(run_module, "DeadLetterPublisher", SlowPublisher)
    run = _run()
    start = threading.Barrier(8)
    got: list[object] = []

    def lane() -> None:
        start.wait()
        got.append(run._dead_letters())

    threads = [threading.Thread(target=lane) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1
    assert {id(p) for p in got} == {id(made[0])}


class HoldingProducer:
    """A Producer whose broker acknowledges a dead letter only at `flush`; `during_flush`
    plays a lane that dead-letters (and so finishes) an event while a flush is running."""

    def __init__(self, conf: dict) -> None:
        self.unacknowledged: dict[int, object] = {}
        self.during_flush = None

    def produce(self, topic, key, value, headers, on_delivery) -> None:
        offset = int(dict(headers)["binlake.offset"])
        self.unacknowledged[offset] = on_delivery

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        acked, self.unacknowledged = self.unacknowledged, {}
        if self.during_flush is not None:
            action, self.during_flush = self.during_flush, None
            action()
        for on_delivery in acked.values():
            on_delivery(None, None)
        return 0


class LaneAfterCommitConsumer(RecordingConsumer):
    """A lane dead-letters (and finishes) an event just after Kafka takes a commit."""

    def __init__(self) -> None:
        super().__init__()
        self.after_commit = None

    def commit(self, offsets, asynchronous: bool) -> None:
        super().commit(offsets, asynchronous)
        if self.after_commit is not None:
            action, self.after_commit = self.after_commit, None
            action()


def test_a_kill_after_a_dead_letter_send_loses_no_dead_letter_the_commit_passed(
        monkeypatch) -> None:
    """A SIGKILL at `after_dead_letter_send` loses every dead letter the broker has not
    acknowledged yet; the rerun redoes only events at or past the committed offset. So
    at each such moment no unacknowledged dead letter may sit below the commit. Lanes
    dead-letter at every step of the commit (while it flushes, just after it commits):
    flushing before reading the offset, or committing before flushing, breaks this."""
    from binlog_assets.consume import deadletter

    monkeypatch.setattr(deadletter, "Producer", HoldingProducer)
    run, consumer = _run(), LaneAfterCommitConsumer()
    tracker = OffsetTracker(0)
    tracker.received_many(list(range(6)))
    producer: HoldingProducer | None = None
    kills: list[tuple[int, int, set[int]]] = []  # (sending, committed, unacknowledged)
    sending: list[int] = []

    def at_fault_point(name: str) -> None:
        if name == "after_dead_letter_send":
            committed = consumer.commits[-1][0] if consumer.commits else 0
            kills.append((sending[-1], committed, set(producer.unacknowledged)))

    monkeypatch.setattr(deadletter, "fault_point", at_fault_point)

    def lane_dead_letters(offset: int) -> None:
        nonlocal producer
        sending.append(offset)
        dlq = run._dead_letters()
        producer = dlq._producer
        dlq.publish(DeadLetter("t", 0, offset, None, b"{}", (), "handler", "boom", 4))
        tracker.done(offset)

    lane_dead_letters(0)
    producer.during_flush = lambda: lane_dead_letters(1)
    consumer.after_commit = lambda: lane_dead_letters(2)
    run._commit(consumer, tracker, None)
    lane_dead_letters(3)
    run._commit(consumer, tracker, None)
    lane_dead_letters(4)

    assert sorted(k[0] for k in kills) == [0, 1, 2, 3, 4]
    # The point is between the send and its acknowledgement: the letter being sent is
    # queued and not yet acknowledged.
    assert all(offset in unacked for offset, _committed, unacked in kills), kills
    lost = [(offset, committed, sorted(u for u in unacked if u < committed))
            for offset, committed, unacked in kills if any(u < committed for u in unacked)]
    assert lost == [], f"a kill here loses dead letters the commit passed: {lost}"
    # And the commits did move: the check above was not vacuous.
    assert consumer.commits[-1][0] >= 3, consumer.commits
