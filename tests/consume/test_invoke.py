"""Handler calls: batch handlers (order, done-ness, a failing batch replayed one event at
a time), per-handler metrics and latency buckets, and the watchdog that names a handler
running past its timeout."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import defaultdict

import pytest

from binlog_assets.consume.errors import ErrorPolicy, failed_handlers
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.invoke import BATCH_MAX_EVENTS, _bucket, _bucket_ms, _quantile_ms
from binlog_assets.consume.lanes import DispatchOptions, LaneDispatcher
from binlog_assets.consume.offsets import OffsetTracker
from binlog_assets.formats.event import ChangeEvent, Position

FAST = {"backoff_initial": 0.001, "backoff_max": 0.002}


def event(offset: int, key: int, table: str = "db.t") -> ChangeEvent:
    return ChangeEvent(table=table, op="u", key=(key,), key_columns=("id",), before=None,
                       after={"id": key, "v": offset}, position=Position(1, 7, offset, 0),
                       source_ts=None, topic="binlog", partition=0, offset=offset)


def test_batch_handler_gets_lists_in_key_order_and_every_event_is_done() -> None:
    seen: dict[int, list[int]] = defaultdict(list)
    sizes: list[int] = []
    lock = threading.Lock()

    def many(events: list[ChangeEvent]) -> None:
        assert isinstance(events, list) and events
        with lock:
            sizes.append(len(events))
            for e in events:
                seen[e.key[0]].append(e.offset)

    registry = HandlerRegistry()
    registry.register("db.t", many, name="bulk", batch=True)
    rng = random.Random(7)
    events = [event(o, rng.randrange(50)) for o in range(3000)]
    tracker = OffsetTracker(0)
    with LaneDispatcher(registry, DispatchOptions(slots=4),
                        on_done_many=tracker.done_many) as dispatcher:
        tracker.received_many([e.offset for e in events])
        for i in range(0, len(events), 500):
            dispatcher.submit_many(events[i:i + 500])
        assert dispatcher.drain(timeout=20)
        metrics = dispatcher.handler_metrics()["bulk"]
    assert tracker.committable() == 3000
    expected: dict[int, list[int]] = defaultdict(list)
    for e in events:
        expected[e.key[0]].append(e.offset)
    assert seen == expected  # every event once, each key in order
    assert max(sizes) <= BATCH_MAX_EVENTS
    assert len(sizes) < len(events) / 5  # batched, not one call per event
    assert (metrics.events, metrics.calls) == (3000, len(sizes))


def test_a_failing_batch_is_replayed_one_event_at_a_time() -> None:
    calls: list[list[int]] = []

    def many(events: list[ChangeEvent]) -> None:
        calls.append([e.offset for e in events])
        if any(e.offset == 5 for e in events):
            raise ValueError("row 5 is bad")

    registry = HandlerRegistry()
    registry.register("db.t", many, name="bulk", batch=True)
    letters: list[tuple[int, BaseException]] = []
    tracker = OffsetTracker(0)
    with LaneDispatcher(registry, DispatchOptions(slots=1), on_done_many=tracker.done_many,
                        policy=ErrorPolicy(max_retries=1, **FAST), dead_letter=lambda e, err,
                        n: letters.append((e.offset, err))) as d:
        tracker.received_many(range(10))
        d.submit_many([event(o, o) for o in range(10)])
        assert d.drain(timeout=10)
        metrics = d.handler_metrics()["bulk"]
    assert calls[0] == list(range(10))  # the whole run in one call
    # then each event alone, event 5 twice (a retry), and only event 5 dead-lettered
    assert calls[1:] == [[0], [1], [2], [3], [4], [5], [5], [6], [7], [8], [9]]
    assert [o for o, _ in letters] == [5]
    assert failed_handlers(letters[0][1]) == ("bulk",)
    assert tracker.committable() == 10
    assert (metrics.events, metrics.dead_lettered, metrics.retries) == (9, 1, 1)


def test_strict_mode_never_commits_past_an_event_of_a_failed_batch() -> None:
    def many(events: list[ChangeEvent]) -> None:
        if any(e.offset == 3 for e in events):
            raise ValueError("bad")

    registry = HandlerRegistry()
    registry.register("db.t", many, batch=True)
    tracker = OffsetTracker(0)
    with LaneDispatcher(registry, DispatchOptions(slots=1), on_done_many=tracker.done_many,
                        policy=ErrorPolicy(max_retries=0, strict=True, **FAST)) as d:
        tracker.received_many(range(8))
        d.submit_many([event(o, o) for o in range(8)])
        d.drain(timeout=10)
        assert d.failure is not None
    assert tracker.committable() == 3


def test_batch_and_single_handlers_of_one_table_both_see_every_event() -> None:
    got: dict[str, list[int]] = {"bulk": [], "one": []}

    def many(events: list[ChangeEvent]) -> None:
        got["bulk"].extend(e.offset for e in events)

    def one(e: ChangeEvent) -> None:
        got["one"].append(e.offset)

    registry = HandlerRegistry()
    registry.register("db.t", many, batch=True)
    registry.register("db.t", one)
    with LaneDispatcher(registry, DispatchOptions(slots=1)) as d:
        d.submit_many([event(o, 1) for o in range(100)])
        assert d.drain(timeout=10)
    assert got == {"bulk": list(range(100)), "one": list(range(100))}


def test_a_handler_past_its_timeout_is_named(caplog: pytest.LogCaptureFixture) -> None:
    def stuck(e: ChangeEvent) -> None:
        time.sleep(0.4)

    registry = HandlerRegistry()
    registry.register("db.t", stuck, name="slow-index")
    caplog.set_level(logging.WARNING, logger="binlog_assets.consume.invoke")
    with LaneDispatcher(registry, DispatchOptions(slots=1, handler_timeout_seconds=0.1)) as d:
        d.submit_many([event(0, 1), event(1, 1)])
        assert d.drain(timeout=10)
        metrics = d.handler_metrics()["slow-index"]
    assert metrics.timeouts == 2  # each call once, however long it runs
    warnings = [r.getMessage() for r in caplog.records]
    assert any("'slow-index' has been running" in w and "db.t binlog[0]@0" in w
               for w in warnings), warnings


def test_latency_buckets_are_within_ten_percent() -> None:
    for us in (0, 1, 15, 16, 17, 100, 999, 12_345, 2_000_000):
        ms = _bucket_ms(_bucket(us / 1_000_000))
        assert abs(ms - us / 1000) <= max(0.001, 0.1 * us / 1000), us
    latency = {_bucket(0.001): 98, _bucket(0.5): 2}
    assert _quantile_ms(latency, 0.5) == pytest.approx(1.0, rel=0.1)
    assert _quantile_ms(latency, 0.99) == pytest.approx(500, rel=0.1)
    assert _quantile_ms({}, 0.5) == 0.0
