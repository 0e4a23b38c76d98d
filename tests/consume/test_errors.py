"""Failing handlers (invariant 6): retries with backoff, dead letters that count as done,
the per-key breaker, and strict mode stopping the commit before the failed offset."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from binlog_assets.consume.errors import (
    REASON_BREAKER_OPEN,
    REASON_RETRIES_EXHAUSTED,
    BreakerOpenError,
    DispatcherStopped,
    ErrorPolicy,
    KeyBreaker,
    dead_letter_reason,
    failed_handlers,
)
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.lanes import DispatchOptions, LaneDispatcher
from binlog_assets.consume.offsets import OffsetTracker
from binlog_assets.formats.event import ChangeEvent, Position

FAST = {"backoff_initial": 0.001, "backoff_max": 0.004}


def event(offset: int, table: str = "db.t", key: tuple = (1,)) -> ChangeEvent:
    return ChangeEvent(
        table=table,
        op="u",
        key=key,
        key_columns=("id",),
        before=None,
        after={"id": key[0]},
        position=Position(1, 3, offset),
        source_ts=None,
        topic="binlog",
        partition=2,
        offset=offset,
    )


class Letters:
    """A dead-letter callback that keeps what it was given."""

    def __init__(self) -> None:
        self.got: list[tuple[int, BaseException, int]] = []
        self.lock = threading.Lock()

    def __call__(self, ev: ChangeEvent, error: BaseException, attempts: int) -> None:
        with self.lock:
            self.got.append((ev.offset, error, attempts))


def test_policy_defaults_and_exponential_backoff() -> None:
    policy = ErrorPolicy()
    assert (policy.max_retries, policy.strict, policy.breaker_threshold) == (3, False, 5)
    assert [policy.backoff(n) for n in range(1, 8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": 1.5}, "max_retries"),
        ({"breaker_threshold": -1}, "breaker_threshold"),
        ({"backoff_initial": -0.1}, "backoff_initial"),
        ({"backoff_max": "2s"}, "backoff_max"),
        ({"backoff_initial": 1.0, "backoff_max": 0.5}, "backoff_max"),
        ({"strict": "yes"}, "strict"),
    ],
)
def test_policy_errors_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"ErrorPolicy.{field}"):
        ErrorPolicy(**kwargs)


def test_key_breaker_opens_after_consecutive_dead_letters_only() -> None:
    breaker = KeyBreaker(3)
    assert not breaker.record_dead_letter("a")
    assert not breaker.record_dead_letter("a")
    breaker.record_success("a")  # a success breaks the streak
    assert not breaker.record_dead_letter("a")
    assert not breaker.record_dead_letter("a")
    assert not breaker.is_open("a")
    assert breaker.record_dead_letter("a")
    assert breaker.is_open("a") and not breaker.is_open("b")
    assert breaker.open_keys() == {"a"}


def test_dead_letter_reason() -> None:
    assert dead_letter_reason(ValueError("x")) == REASON_RETRIES_EXHAUSTED
    assert dead_letter_reason(BreakerOpenError("db.t", (1,), 5)) == REASON_BREAKER_OPEN


def test_transient_failure_is_retried_then_handled() -> None:
    calls = Counter()

    def flaky(ev: ChangeEvent) -> None:
        calls[ev.offset] += 1
        if calls[ev.offset] <= 2:
            raise ConnectionError("try again")

    registry = HandlerRegistry()
    registry.register("db.t", flaky)
    letters = Letters()
    policy = ErrorPolicy(max_retries=3, **FAST)
    with LaneDispatcher(registry, DispatchOptions(slots=2), policy=policy,
                        dead_letter=letters) as dispatcher:
        dispatcher.submit(event(0))
        assert dispatcher.drain(timeout=5)
        [metrics] = dispatcher.handler_metrics().values()
        assert dispatcher.dead_lettered == 0
    assert calls[0] == 3
    assert letters.got == []
    assert (metrics.events, metrics.errors, metrics.retries, metrics.calls) == (1, 2, 2, 3)


def test_exhausted_retries_dead_letter_the_event_and_it_counts_as_done() -> None:
    calls = Counter()

    def broken(ev: ChangeEvent) -> None:
        calls[ev.offset] += 1
        if ev.offset == 1:
            raise ValueError("cannot apply row")

    registry = HandlerRegistry()
    registry.register("db.t", broken, name="apply")
    letters = Letters()
    tracker = OffsetTracker(0)
    policy = ErrorPolicy(max_retries=2, **FAST)
    with LaneDispatcher(registry, DispatchOptions(slots=4), policy=policy, dead_letter=letters,
                        on_done_many=tracker.done_many) as dispatcher:
        tracker.received_many([0, 1, 2])
        dispatcher.submit_many([event(0), event(1), event(2)])
        assert dispatcher.drain(timeout=5)
        metrics = dispatcher.handler_metrics()["apply"]
        assert dispatcher.dead_lettered == 1
    assert calls[1] == 3  # the first attempt and two retries
    [(offset, error, attempts)] = letters.got
    assert (offset, attempts) == (1, 3)
    assert isinstance(error, ValueError)
    assert any("handler 'apply' failed on db.t binlog[2]@1" in note for note in error.__notes__)
    assert tracker.committable() == 3  # dead-lettered = done
    assert failed_handlers(error) == ("apply",)  # the dead letter's binlake.handler header
    assert dead_letter_reason(error) == REASON_RETRIES_EXHAUSTED
    assert (metrics.events, metrics.retries, metrics.errors, metrics.dead_lettered) == (2, 2, 3, 1)


def test_one_of_several_handlers_failing_dead_letters_once_and_reruns_only_itself() -> None:
    calls = Counter()

    def good(ev: ChangeEvent) -> None:
        calls["good"] += 1

    def bad(ev: ChangeEvent) -> None:
        calls["bad"] += 1
        raise RuntimeError("bad handler")

    registry = HandlerRegistry()
    registry.register("db.t", good, name="good")
    registry.register("db.t", bad, name="bad")
    letters = Letters()
    policy = ErrorPolicy(max_retries=1, **FAST)
    with LaneDispatcher(registry, DispatchOptions(slots=1), policy=policy,
                        dead_letter=letters) as dispatcher:
        dispatcher.submit(event(0))
        assert dispatcher.drain(timeout=5)
    assert calls == {"good": 1, "bad": 2}
    [(_, error, attempts)] = letters.got
    assert isinstance(error, RuntimeError) and attempts == 2


def test_open_breaker_dead_letters_a_poison_key_without_retries_while_others_flow() -> None:
    calls = Counter()

    def handler(ev: ChangeEvent) -> None:
        calls[ev.key] += 1
        if ev.key == ("poison",):
            raise ValueError("poison row")

    registry = HandlerRegistry()
    registry.register("db.t", handler)
    letters = Letters()
    policy = ErrorPolicy(max_retries=2, breaker_threshold=2, **FAST)
    events = [event(o, key=("poison",) if o % 2 else ("fine",)) for o in range(12)]
    # One lane: the poison key and the healthy one share it.
    with LaneDispatcher(registry, DispatchOptions(slots=1), policy=policy,
                        dead_letter=letters) as dispatcher:
        dispatcher.submit_many(events)
        assert dispatcher.drain(timeout=5)
        breakers_open = dispatcher.breakers_open
    assert [o for o, _, _ in letters.got] == [1, 3, 5, 7, 9, 11]
    assert [a for _, _, a in letters.got] == [3, 3, 0, 0, 0, 0]
    assert all(isinstance(e, BreakerOpenError) for _, e, _ in letters.got[2:])
    assert calls[("poison",)] == 6  # two events x three attempts, then no more calls
    assert calls[("fine",)] == 6
    assert [dead_letter_reason(e) for _, e, _ in letters.got] == (
        [REASON_RETRIES_EXHAUSTED] * 2 + [REASON_BREAKER_OPEN] * 4)
    assert breakers_open == 1


def test_strict_mode_stops_and_the_commit_stays_before_the_failed_offset() -> None:
    handled: list[int] = []

    def handler(ev: ChangeEvent) -> None:
        if ev.offset == 20:
            raise ValueError("strict failure")
        time.sleep(0.001)
        handled.append(ev.offset)

    registry = HandlerRegistry()
    registry.register("db.t", handler)
    letters = Letters()
    tracker = OffsetTracker(0)
    policy = ErrorPolicy(max_retries=1, strict=True, **FAST)
    events = [event(o, key=(o % 4,)) for o in range(60)]
    with LaneDispatcher(registry, DispatchOptions(slots=4), policy=policy, dead_letter=letters,
                        on_done_many=tracker.done_many) as dispatcher:
        tracker.received_many(range(60))
        dispatcher.submit_many(events)
        assert dispatcher.drain(timeout=5) is False
        assert isinstance(dispatcher.failure, ValueError)
        time.sleep(0.05)
        assert tracker.committable() <= 20
        with pytest.raises(DispatcherStopped) as stopped:
            dispatcher.submit(event(60))
        assert stopped.value.__cause__ is dispatcher.failure
    assert letters.got == []
    assert 20 not in handled
    # Key 0's lane is serial: nothing of that key after offset 20 ran.
    assert not [o for o in handled if o > 20 and o % 4 == 0]


def test_a_failing_dead_letter_callback_stops_the_dispatcher() -> None:
    def handler(ev: ChangeEvent) -> None:
        raise ValueError("bad row")

    def dead_letter(ev: ChangeEvent, error: BaseException, attempts: int) -> None:
        raise OSError("dead-letter topic unreachable")

    registry = HandlerRegistry()
    registry.register("db.t", handler)
    tracker = OffsetTracker(0)
    with LaneDispatcher(registry, DispatchOptions(slots=1), policy=ErrorPolicy(max_retries=0),
                        dead_letter=dead_letter, on_done_many=tracker.done_many) as dispatcher:
        tracker.received(0)
        dispatcher.submit(event(0))
        assert dispatcher.drain(timeout=5) is False
        assert isinstance(dispatcher.failure, OSError)
    assert tracker.committable() == 0  # neither handled nor dead-lettered: not done


def test_system_exit_from_a_handler_stops_without_retries() -> None:
    calls = Counter()

    def handler(ev: ChangeEvent) -> None:
        calls[ev.offset] += 1
        raise SystemExit(3)

    registry = HandlerRegistry()
    registry.register("db.t", handler)
    letters = Letters()
    with LaneDispatcher(registry, DispatchOptions(slots=1), dead_letter=letters) as dispatcher:
        dispatcher.submit(event(0))
        assert dispatcher.drain(timeout=5) is False
        assert isinstance(dispatcher.failure, SystemExit)
        assert dispatcher._threads[0].is_alive()
    assert calls[0] == 1 and letters.got == []


def test_close_interrupts_a_retry_backoff() -> None:
    registry = HandlerRegistry()
    registry.register("db.t", lambda ev: 1 / 0)
    policy = ErrorPolicy(max_retries=5, backoff_initial=10.0, backoff_max=10.0)
    dispatcher = LaneDispatcher(registry, DispatchOptions(slots=1), policy=policy)
    dispatcher.submit(event(0))
    time.sleep(0.05)
    began = time.monotonic()
    dispatcher.close()
    assert time.monotonic() - began < 5  # the backoff it interrupts is 10 s
    assert not dispatcher._threads[0].is_alive()
