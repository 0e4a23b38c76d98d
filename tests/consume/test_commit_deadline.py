"""An offset commit with a deadline: librdkafka's synchronous commit can wait forever for a
group coordinator that does not come back, and a run must fail instead, naming what it was
committing, and leave the stuck consumer to the commit's thread (no close under it).

No broker: a fake consumer's commit blocks until the test lets it go.
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.kafka_commit import Committer, CommitTimeout
from binlog_assets.consume.offsets import OffsetTracker
from binlog_assets.consume.run import BoundedRun, RunSettings


class StuckConsumer:
    """`commit` blocks until `release` is set (then fails with `error`, if given)."""

    def __init__(self, error: KafkaError | None = None) -> None:
        self.release = threading.Event()
        self.error = error
        self.calls = 0
        self.committed: list[int] = []
        self.closed = threading.Event()
        self.commit_running = threading.Event()

    def commit(self, offsets, asynchronous: bool) -> None:
        assert not asynchronous
        self.calls += 1
        self.commit_running.set()
        self.release.wait()
        if self.error is not None:
            raise KafkaException(self.error)
        self.committed.append(offsets[0].offset)

    def close(self) -> None:
        # Closing under a commit in flight is what the deadline must never do.
        assert not (self.commit_running.is_set() and not self.release.is_set())
        self.closed.set()


def _offsets(offset: int = 7) -> list[TopicPartition]:
    return [TopicPartition("orders", 3, offset)]


def test_a_commit_that_answers_in_time_lands() -> None:
    consumer = StuckConsumer()
    consumer.release.set()
    Committer(consumer, 5.0).commit(_offsets(), "committing orders[3]@7")
    assert consumer.committed == [7]


def test_a_stuck_commit_fails_at_its_deadline_naming_partition_and_offset() -> None:
    consumer = StuckConsumer()
    committer = Committer(consumer, 0.5)
    began = time.monotonic()
    with pytest.raises(CommitTimeout, match=r"committing orders\[3\]@7: .*0\.5 s"):
        committer.commit(_offsets(), "committing orders[3]@7")
    assert time.monotonic() - began < 5
    assert committer.abandoned
    # Another commit on the abandoned consumer fails at once rather than queueing up.
    with pytest.raises(CommitTimeout, match="still stuck"):
        committer.commit(_offsets(8), "committing orders[3]@8")
    assert consumer.calls == 1
    # When the coordinator answers at last, the commit's thread closes the consumer.
    consumer.release.set()
    assert consumer.closed.wait(5)


def test_a_non_retriable_error_is_raised_as_it_was() -> None:
    consumer = StuckConsumer(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))
    consumer.release.set()
    with pytest.raises(RuntimeError, match="GROUP_AUTHORIZATION_FAILED"):
        Committer(consumer, 5.0).commit(_offsets(), "committing orders[3]@7")
    assert consumer.calls == 1


def test_a_run_whose_commit_is_stuck_fails_and_does_not_close_the_consumer() -> None:
    run = BoundedRun("orders", 3, HandlerRegistry(),
                     RunSettings(kafka_conf={}, group_id="g", format="debezium",
                                 commit_timeout_seconds=0.3))
    consumer = StuckConsumer()
    tracker = OffsetTracker(0)
    tracker.received_many([0, 1])
    tracker.done_many([0, 1])
    with pytest.raises(CommitTimeout, match=r"orders\[3\]@2"):
        run._commit(consumer, tracker, None)
    assert run._committer is not None and run._committer.abandoned
    consumer.release.set()
    assert consumer.closed.wait(5)


def test_a_whole_run_fails_at_the_deadline_instead_of_hanging(monkeypatch) -> None:
    from test_run_settings import FakeConsumer

    from binlog_assets.consume import run as run_module

    made: list[FakeConsumer] = []

    class FrozenCoordinator(FakeConsumer):
        def commit(self, offsets=None, asynchronous=False) -> None:
            self.commit_running.set()
            self.release.wait()

        def close(self) -> None:
            assert self.release.is_set(), "closed under a commit in flight"
            self.closed.set()

    def consumer(conf: dict) -> FakeConsumer:
        made.append(FrozenCoordinator(conf, 50))
        made[-1].release, made[-1].commit_running = threading.Event(), threading.Event()
        made[-1].closed = threading.Event()
        return made[-1]

    monkeypatch.setattr(run_module, "Consumer", consumer)
    registry = HandlerRegistry()
    registry.register("db.t", lambda event: None)
    run = BoundedRun("t", 0, registry, RunSettings(kafka_conf={}, group_id="g",
                                                   format="debezium",
                                                   commit_timeout_seconds=0.5))
    with pytest.raises(CommitTimeout, match=r"committing t\[0\]@50"):
        run.run()
    (stuck,) = made
    assert not stuck.closed.is_set()
    stuck.release.set()
    assert stuck.closed.wait(5)
