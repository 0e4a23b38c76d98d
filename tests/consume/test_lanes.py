"""LaneDispatcher: per-key order under any slot count (invariant 1), commits that never pass
an undone event (invariant 2), DDL barriers, concurrent handlers, backpressure."""

from __future__ import annotations

import itertools
import re
import threading
import time
import zlib
from collections import Counter, defaultdict
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from binlog_assets.consume import lanes as lanes_module
from binlog_assets.consume.errors import (
    REASON_RETRIES_EXHAUSTED,
    DispatcherStopped,
    ErrorPolicy,
    dead_letter_reason,
)
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.lanes import DispatchOptions, LaneDispatcher
from binlog_assets.consume.offsets import OffsetTracker
from binlog_assets.consume.slot_routing import (
    KEY_SLOT_CACHE,
    ORDERING_MODES,
    ordering_key_bytes,
    table_slots,
)
from binlog_assets.formats.event import OP_DDL, ChangeEvent, Position

THREADED = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def event(
    offset: int, table: str = "db.t", key: tuple = (1,), op: str = "u", row: int = 0
) -> ChangeEvent:
    """An event whose position grows with (offset, row), as in one partition's binlog."""
    return ChangeEvent(
        table=table,
        op=op,
        key=key,
        key_columns=("id",) if key else (),
        before=None,
        after=None if op in ("d", "t", OP_DDL) else {"id": key},
        position=Position(1, 7, offset, row),
        source_ts=None,
        topic="binlog",
        partition=0,
        offset=offset,
        row_index=row,
        ddl="ALTER TABLE t ADD c INT" if op == OP_DDL else None,
    )


class Journal:
    """Handlers that record when each event started and ended, on one shared clock."""

    def __init__(self, delays: dict[tuple[int, int], float] | None = None) -> None:
        self.clock = itertools.count()  # next() is atomic under the GIL
        self.runs: list[tuple[str, ChangeEvent, int, int]] = []
        self.delays = delays or {}

    def handler(self, name: str):
        def run(ev: ChangeEvent) -> None:
            start = next(self.clock)
            delay = self.delays.get((ev.offset, ev.row_index), 0.0)
            if delay:
                time.sleep(delay)
            self.runs.append((name, ev, start, next(self.clock)))

        return run

    def spans(self) -> dict[tuple[int, int], tuple[int, int]]:
        """(offset, row) -> (first start, last end) over all of the event's handlers."""
        spans: dict[tuple[int, int], tuple[int, int]] = {}
        for _, ev, start, end in self.runs:
            at = (ev.offset, ev.row_index)
            first, last = spans.get(at, (start, end))
            spans[at] = (min(first, start), max(last, end))
        return spans


def ordering_key(ev: ChangeEvent, mode: str) -> tuple:
    if mode == "partition":
        return ("partition",)
    if mode == "key" and ev.key:
        return ("key", ev.table, ev.key)
    return ("table", ev.table)


TABLES = ("db.a", "db.b", "db.c")


def journal_registry(journal: Journal) -> HandlerRegistry:
    registry = HandlerRegistry()
    registry.register("db.a", journal.handler("a"))
    registry.register(r"db\.(a|b)", journal.handler("ab"))  # db.a has two handlers
    registry.register("db.c", journal.handler("c"))
    return registry


@st.composite
def streams(draw: st.DrawFn, with_ddl: bool = True) -> dict:
    """Records with random gaps, 1-2 events each, random keys, tables, sleeps and batching."""
    ops = ["c", "u", "u", "u", "d"] + ([OP_DDL] if with_ddl else [])
    records = draw(
        st.lists(
            st.tuples(
                st.integers(1, 4),  # gap to the previous offset
                st.lists(
                    st.tuples(st.sampled_from(TABLES), st.integers(0, 5), st.sampled_from(ops)),
                    min_size=1,
                    max_size=2,
                ),
            ),
            min_size=10,
            max_size=80,
        )
    )
    events, offset = [], draw(st.integers(0, 50))
    for gap, rows in records:
        offset += gap
        for row, (table, key, op) in enumerate(rows):
            events.append(event(offset, table, () if op == OP_DDL else (key,), op, row))
    delays = {
        (ev.offset, ev.row_index): draw(st.sampled_from([0.0, 0.0, 0.0, 0.0002, 0.001]))
        for ev in events
    }
    offsets = sorted({ev.offset for ev in events})
    cuts = sorted(draw(st.sets(st.sampled_from(offsets), max_size=5)) | {offsets[-1] + 1})
    batches, start = [], offsets[0]
    for cut in cuts:
        batch = [ev for ev in events if start <= ev.offset < cut]
        if batch:
            batches.append(batch)
        start = cut
    slots = draw(st.integers(1, 64))
    return {
        "events": events,
        "batches": batches,
        "delays": delays,
        "slots": slots,
        "workers": draw(st.integers(1, min(slots, 16))),
        "ordering": draw(st.sampled_from(ORDERING_MODES)),
        "table_ordering": draw(
            st.dictionaries(st.sampled_from(TABLES), st.sampled_from(ORDERING_MODES))
        ),
    }


@given(stream=streams())
@THREADED
def test_per_key_order_and_ddl_barriers_under_any_lane_count(stream: dict) -> None:
    """Invariant 1, and the DDL barrier, with random slots, workers, modes and timings."""
    journal = Journal(stream["delays"])
    options = DispatchOptions(slots=stream["slots"], workers=stream["workers"],
                              ordering=stream["ordering"],
                              table_ordering=stream["table_ordering"])
    with LaneDispatcher(journal_registry(journal), options) as dispatcher:
        for batch in stream["batches"]:
            dispatcher.submit_many(batch)
        assert dispatcher.drain(timeout=30), dispatcher.failure

    events = stream["events"]
    handlers_of = {"db.a": 2, "db.b": 1, "db.c": 1}
    ran = Counter((ev.offset, ev.row_index) for _, ev, _, _ in journal.runs)
    assert all(ran[(ev.offset, ev.row_index)] == handlers_of[ev.table] for ev in events)

    def mode(ev: ChangeEvent) -> str:
        return stream["table_ordering"].get(ev.table, stream["ordering"])

    spans = journal.spans()
    for first, later in itertools.combinations(events, 2):  # `first` precedes `later`
        assert first.sort_key() < later.sort_key()
        a, b = spans[(first.offset, first.row_index)], spans[(later.offset, later.row_index)]
        same_key = mode(first) == mode(later) and ordering_key(first, mode(first)) == (
            ordering_key(later, mode(later))
        )
        barrier = first.table == later.table and OP_DDL in (first.op, later.op)
        if same_key or barrier:
            assert a[1] < b[0], f"{later} started before {first} ended"


@given(stream=streams(with_ddl=False), data=st.data())
@THREADED
def test_commit_never_passes_an_event_that_is_not_done(stream: dict, data: st.DataObject) -> None:
    """Invariant 2 through the dispatcher: checked at every done report and every submit.

    Some records fail every attempt: dead-lettered after their retry, they count as done.
    """
    expected = Counter(ev.offset for ev in stream["events"])
    failing = data.draw(st.sets(st.sampled_from(sorted(expected)), max_size=8))
    letters: list[tuple[int, str]] = []
    finished: Counter[int] = Counter()
    reported: Counter[int] = Counter()
    tracker = OffsetTracker(stream["events"][0].offset)
    check = threading.Lock()
    delays = stream["delays"]

    def handler(ev: ChangeEvent) -> None:
        time.sleep(delays[(ev.offset, ev.row_index)])
        if ev.offset in failing:
            raise RuntimeError("poison")
        with check:
            finished[ev.offset] += 1

    def dead_letter(ev: ChangeEvent, error: BaseException, attempts: int) -> None:
        with check:
            finished[ev.offset] += 1
            letters.append((ev.offset, dead_letter_reason(error)))

    def assert_never_past_undone() -> None:
        committable = tracker.committable()
        assert all(reported[o] for o in expected if o < committable)

    def on_done_many(offsets: list[int]) -> None:
        with check:
            for offset in offsets:
                assert finished[offset] == expected[offset], "reported before all rows were done"
                reported[offset] += 1
            tracker.done_many(offsets)
            assert_never_past_undone()

    registry = HandlerRegistry()
    registry.register(r"db\..*", handler)
    policy = ErrorPolicy(max_retries=1, backoff_initial=0.0, breaker_threshold=2)
    options = DispatchOptions(slots=stream["slots"], workers=stream["workers"],
                              ordering=stream["ordering"],
                              table_ordering=stream["table_ordering"])
    with LaneDispatcher(registry, options, on_done_many=on_done_many, policy=policy,
                        dead_letter=dead_letter) as dispatcher:
        for batch in stream["batches"]:
            tracker.received_many(sorted({ev.offset for ev in batch}))
            dispatcher.submit_many(batch)
            with check:
                assert_never_past_undone()
        assert dispatcher.drain(timeout=30), dispatcher.failure
    assert all(n == 1 for n in reported.values())
    assert set(reported) == set(expected)
    # Every failing record is dead-lettered; an open breaker may dead-letter more of its key.
    assert failing <= {o for o, _ in letters}
    assert {o for o, reason in letters if reason == REASON_RETRIES_EXHAUSTED} <= failing
    assert tracker.committable() == max(expected) + 1


@given(
    key=st.tuples(st.integers() | st.text(max_size=8) | st.binary(max_size=8)),
    table=st.sampled_from(["db.t", "shop_1.orders", "société.clients"]),
    mode=st.sampled_from(ORDERING_MODES),
    slots=st.integers(1, 1024),
)
@settings(max_examples=100, deadline=None)
def test_slot_is_crc32_of_the_ordering_key_bytes(key, table, mode, slots) -> None:
    ev = event(3, table, key)
    with LaneDispatcher(HandlerRegistry(),
                        DispatchOptions(slots=slots, workers=1, ordering=mode)) as dispatcher:
        assert lanes_taken(dispatcher, [ev]) == {3: zlib.crc32(ordering_key_bytes(ev, mode))
                                                 % slots}


def lanes_taken(dispatcher: LaneDispatcher, events: list[ChangeEvent]) -> dict[int, int]:
    """Each event's slot (by offset) as `submit_many` queues it."""
    taken: dict[int, int] = {}
    queue = dispatcher._enqueue

    def watched(per_slot: dict[int, list[ChangeEvent]]) -> None:
        taken.update((e.offset, slot) for slot, batch in per_slot.items() for e in batch)
        queue(per_slot)

    with patch.object(dispatcher, "_enqueue", watched):
        dispatcher.submit_many(events)
    return taken


def test_ordering_key_bytes_are_canonical() -> None:
    assert ordering_key_bytes(event(1, "db.t", (7, "x")), "key") == b"key\0db.t\0(7, 'x')"
    assert ordering_key_bytes(event(1, "db.t", ()), "key") == b"table\0db.t"
    assert ordering_key_bytes(event(1, "db.t"), "table") == b"table\0db.t"
    assert ordering_key_bytes(event(1, "db.t"), "partition") == b"partition\0binlog\x000"
    with pytest.raises(ValueError, match="ordering must be one of"):
        ordering_key_bytes(event(1), "row")


def ddl_run(ordering: str, slots: int, workers: int, barrier_op: str = OP_DDL
            ) -> tuple[Journal, list[ChangeEvent]]:
    delays = {(o, 0): 0.002 * (o % 3) for o in range(200)}
    journal = Journal(delays)
    registry = HandlerRegistry()
    registry.register("db.t", journal.handler("t"))
    registry.register("db.other", journal.handler("other"))
    events = [event(o, "db.t", (o % 20,)) for o in range(40)]
    events += [event(40, "db.t", (), barrier_op)]
    events += [event(o, "db.t" if o % 2 else "db.other", (o % 20,)) for o in range(41, 80)]
    events += [event(80, "db.t", (), barrier_op), event(81, "db.t", (), barrier_op)]
    events += [event(o, "db.t", (o % 20,)) for o in range(82, 120)]
    options = DispatchOptions(slots=slots, workers=workers, ordering=ordering)
    with LaneDispatcher(registry, options) as dispatcher:
        dispatcher.submit_many(events[:30])
        dispatcher.submit_many(events[30:45])  # the first DDL arrives mid-batch
        dispatcher.submit_many(events[45:])
        assert dispatcher.drain(timeout=30)
    return journal, events


@pytest.mark.parametrize("barrier_op", [OP_DDL, "t"])  # a truncate orders like DDL
@pytest.mark.parametrize(
    ("ordering", "slots", "workers"),
    [("key", 16, 16), ("key", 64, 4), ("key", 8, 1), ("table", 16, 16), ("partition", 4, 4)],
)
def test_ddl_is_a_barrier_for_its_table(ordering: str, slots: int, workers: int,
                                        barrier_op: str) -> None:
    journal, events = ddl_run(ordering, slots, workers, barrier_op)
    spans = journal.spans()
    assert len(spans) == len(events)
    ddls = [ev for ev in events if ev.op == barrier_op]
    for ddl in ddls:
        start, end = spans[(ddl.offset, 0)]
        for ev in events:
            if ev.table != "db.t" or ev is ddl:
                continue
            span = spans[(ev.offset, 0)]
            if ev.offset < ddl.offset:
                assert span[1] < start, f"offset {ev.offset} still running when DDL began"
            else:
                assert span[0] > end, f"offset {ev.offset} began before the DDL ended"


def test_several_handlers_run_concurrently_and_the_event_is_done_when_all_are() -> None:
    both_running = threading.Barrier(2, timeout=5)
    slow_finished = threading.Event()
    reported: list[tuple[int, bool]] = []

    def fast(ev: ChangeEvent) -> None:
        both_running.wait()  # only passes if the other handler runs at the same time

    def slow(ev: ChangeEvent) -> None:
        both_running.wait()
        time.sleep(0.05)
        slow_finished.set()

    registry = HandlerRegistry()
    registry.register("db.t", fast, name="fast")
    registry.register("db.t", slow, name="slow")
    def on_done_many(offsets: list[int]) -> None:
        reported.extend((o, slow_finished.is_set()) for o in offsets)

    with LaneDispatcher(registry, DispatchOptions(slots=2),
                        on_done_many=on_done_many) as dispatcher:
        dispatcher.submit(event(0))
        assert dispatcher.drain(timeout=10)
        metrics = dispatcher.handler_metrics()
    assert reported == [(0, True)]
    assert (metrics["fast"].events, metrics["slow"].events) == (1, 1)


def test_a_records_offset_is_done_when_its_last_event_is() -> None:
    release = threading.Event()
    reported: list[int] = []

    def handler(ev: ChangeEvent) -> None:
        if ev.row_index == 1:
            release.wait(5)

    registry = HandlerRegistry()
    registry.register("db.t", handler)
    rows = [event(5, key=(k,), row=k) for k in range(3)]  # one Canal message, three rows
    with LaneDispatcher(registry, DispatchOptions(slots=8),
                        on_done_many=reported.extend) as dispatcher:
        dispatcher.submit_many([event(4, key=(9,)), *rows, event(6, key=(9,))])
        time.sleep(0.1)
        assert 5 not in reported
        release.set()
        assert dispatcher.drain(timeout=5)
    assert sorted(reported) == [4, 5, 6]


def test_a_records_events_must_be_submitted_together() -> None:
    with LaneDispatcher(HandlerRegistry(), DispatchOptions(slots=2)) as dispatcher:
        dispatcher.submit(event(5, row=0))
        with pytest.raises(ValueError, match="submitted together"):
            dispatcher.submit(event(5, row=1))


def test_backpressure_bounds_what_is_in_flight() -> None:
    gate = threading.Event()
    registry = HandlerRegistry()
    registry.register("db.t", lambda ev: gate.wait(10))
    batch, max_in_flight = 20, 50
    offsets = itertools.count()
    options = DispatchOptions(slots=8, max_in_flight=max_in_flight, low_water=10)
    with LaneDispatcher(registry, options) as dispatcher:
        peak = 0
        for _ in range(10):  # the poll loop: pause while full
            if dispatcher.is_full():
                break
            dispatcher.submit_many([event(o, key=(o,)) for o in itertools.islice(offsets, batch)])
            peak = max(peak, dispatcher.in_flight())
        assert dispatcher.is_full()
        assert max_in_flight <= peak <= max_in_flight + batch - 1
        assert not dispatcher.below_low_water()
        # Submitting while full does not block: the records are already fetched.
        began = time.monotonic()
        dispatcher.submit_many([event(next(offsets), key=(0,))])
        # Blocking would wait for the gated handlers (10 s).
        assert time.monotonic() - began < 5
        assert dispatcher.drain(timeout=0.1) is False
        gate.set()
        assert dispatcher.drain(timeout=10)
        assert dispatcher.below_low_water() and not dispatcher.is_full()
        assert dispatcher.in_flight() == 0


def test_handler_exceptions_never_kill_a_lane() -> None:
    calls = Counter()

    def handler(ev: ChangeEvent) -> None:
        calls[ev.offset] += 1
        if ev.offset < 50:
            raise KeyError(ev.offset)

    registry = HandlerRegistry()
    registry.register("db.t", handler)
    letters: list[int] = []
    dispatcher = LaneDispatcher(registry, DispatchOptions(slots=1),
                                policy=ErrorPolicy(max_retries=0, breaker_threshold=0),
                                dead_letter=lambda ev, error, attempts: letters.append(ev.offset))
    with dispatcher:
        dispatcher.submit_many([event(o) for o in range(100)])
        assert dispatcher.drain(timeout=10)
        assert dispatcher._threads[0].is_alive()
    assert letters == list(range(50))
    [metrics] = dispatcher.handler_metrics().values()
    assert (metrics.events, metrics.dead_lettered, metrics.errors) == (50, 50, 50)


def test_close_stops_workers_and_drops_what_has_not_started() -> None:
    started = threading.Event()
    reported: list[int] = []

    def handler(ev: ChangeEvent) -> None:
        started.set()
        time.sleep(0.2)

    registry = HandlerRegistry()
    registry.register("db.t", handler)
    dispatcher = LaneDispatcher(registry, DispatchOptions(slots=1), on_done_many=reported.extend)
    dispatcher.submit_many([event(o) for o in range(10)])
    assert started.wait(5)
    dispatcher.close()
    assert not any(t.is_alive() for t in (*dispatcher._threads, dispatcher._patrol))
    assert len(reported) < 10
    with pytest.raises(DispatcherStopped):
        dispatcher.submit(event(10))


def test_metrics_count_per_handler_and_skipped_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    # The handlers' time on a clock of the test's own, one slot: a busy machine's
    # scheduling cannot move the latencies asserted below.
    now = [0.0]
    monkeypatch.setattr("binlog_assets.consume.lanes.perf_counter", lambda: now[0])
    registry = HandlerRegistry()
    registry.register("db.t", lambda ev: now.__setitem__(0, now[0] + 0.002), name="sleepy")
    registry.register("db.u", lambda ev: None, name="quick")
    with LaneDispatcher(registry, DispatchOptions(slots=1)) as dispatcher:
        dispatcher.submit_many(
            [event(0, op="c"), event(1, op="u"), event(2, op="u"), event(3, "db.unhandled"),
             event(4, "db.u")]
        )
        assert dispatcher.drain(timeout=5)
        metrics = dispatcher.handler_metrics()
        assert (dispatcher.skipped, dispatcher.dead_lettered) == (1, 0)
    assert set(metrics) == {"sleepy", "quick"}
    sleepy = metrics["sleepy"]
    assert (sleepy.events, sleepy.calls, sleepy.errors, sleepy.retries) == (3, 3, 0, 0)
    # Latency per call, within the buckets' 9%: 2 ms, and none for the other.
    assert 1.8 <= sleepy.p50_ms <= sleepy.p99_ms <= 2.2
    assert metrics["quick"].p99_ms < 0.1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"slots": 0}, "slots"),
        ({"workers": 0}, "workers"),
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"max_in_flight": 10, "low_water": 10}, "low_water"),
        ({"ordering": "row"}, "ordering"),
        ({"table_ordering": {"db.t": "rows"}}, "table_ordering['db.t']"),
    ],
)
def test_configuration_errors_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"LaneDispatcher {field} must")):
        LaneDispatcher(HandlerRegistry(), DispatchOptions(**kwargs))


def test_slow_io_handlers_run_on_every_worker_at_once() -> None:
    """5 ms handlers on 1000 keys over 64 workers: all 64 are busy at the same moment.

    The speed-up this gives is measured by bench/bench_slow_handlers.py (not by a timed
    test, which a loaded machine would make flaky); this checks the parallelism it comes
    from: the peak number of handlers running at once.
    """
    lock = threading.Lock()
    running = peak = 0

    def handler(ev: ChangeEvent) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.005)
        with lock:
            running -= 1

    registry = HandlerRegistry()
    registry.register("db.t", handler)
    events = [event(o, key=(o,)) for o in range(1000)]
    with LaneDispatcher(registry, DispatchOptions(slots=512, workers=64)) as dispatcher:
        dispatcher.submit_many(events)
        assert dispatcher.drain(timeout=60)
    assert peak >= 48, peak  # 64 on an idle machine; a serializing dispatcher gives 1


def test_ordering_is_per_key_across_many_keys_and_lanes() -> None:
    seen: dict[tuple, list[int]] = defaultdict(list)
    registry = HandlerRegistry()
    registry.register("db.t", lambda ev: seen[ev.key].append(ev.offset))
    events = [event(o, key=(o % 37,)) for o in range(5000)]
    with LaneDispatcher(registry, DispatchOptions(slots=64, workers=8)) as dispatcher:
        for start in range(0, len(events), 300):
            dispatcher.submit_many(events[start : start + 300])
        assert dispatcher.drain(timeout=30)
    assert len(seen) == 37
    assert all(offsets == sorted(offsets) for offsets in seen.values())
    assert sum(map(len, seen.values())) == 5000


def test_a_keyless_tables_events_keep_their_order_on_its_table_lane() -> None:
    # A table without a primary key: its changes carry no key (or a configured key column
    # whose value is null), and must neither fail routing nor overtake one another.
    seen: dict[str, list[int]] = defaultdict(list)
    registry = HandlerRegistry()
    registry.register(r"db\..*", lambda ev: seen[ev.table].append(ev.offset))
    events = []
    for o in range(3000):
        if o % 3 == 0:
            events.append(event(o, "db.logs", ()))
        elif o % 3 == 1:
            events.append(event(o, "db.nulls", (None,)))
        else:
            events.append(event(o, "db.t", (o % 41,)))
    taken: dict[int, int] = {}
    with LaneDispatcher(registry, DispatchOptions(slots=64, workers=8)) as dispatcher:
        for start in range(0, len(events), 250):
            taken |= lanes_taken(dispatcher, events[start : start + 250])
        assert dispatcher.drain(timeout=30)
        assert dispatcher.failure is None
    assert len({taken[ev.offset] for ev in events if ev.table == "db.logs"}) == 1
    assert seen["db.logs"] == list(range(0, 3000, 3))
    assert seen["db.nulls"] == list(range(1, 3000, 3))
    assert len(seen["db.t"]) == 1000


def test_invariants_hold_when_lanes_take_turns_after_every_event() -> None:
    """With a zero time slice a slot gives its worker up after each event whenever another
    slot waits, so slots are requeued mid-batch all the time: invariants 1 and 2 and the
    DDL barrier must hold exactly as with whole batches (the same property tests)."""
    with patch.object(lanes_module, "_SLICE_SECONDS", 0.0):
        test_per_key_order_and_ddl_barriers_under_any_lane_count()
        test_commit_never_passes_an_event_that_is_not_done()


def test_a_long_lane_takes_turns_with_waiting_lanes_and_keeps_its_order() -> None:
    """One worker, two busy slots: the time slice makes them alternate instead of running
    one slot to its end first, and each slot's events still run in submission order."""
    seen: list[tuple] = []
    registry = HandlerRegistry()

    def handler(ev: ChangeEvent) -> None:
        time.sleep(0.002)
        seen.append((ev.key, ev.offset))

    registry.register("db.t", handler)
    with patch.object(lanes_module, "_SLICE_SECONDS", 0.0), LaneDispatcher(
            registry, DispatchOptions(slots=2, workers=1)) as dispatcher:
        keys = {}
        for k in range(100):  # one key per slot
            probe = event(0, key=(k,))
            keys.setdefault(table_slots(probe, "key", 2).slot(probe.key, 2), (k,))
            if len(keys) == 2:
                break
        a, b = keys.values()
        events = [event(o, key=a if o < 20 else b) for o in range(40)]
        dispatcher.submit_many(events)
        assert dispatcher.drain(timeout=30), dispatcher.failure
    assert len(seen) == 40
    for key in (a, b):
        offsets = [o for k, o in seen if k == key]
        assert offsets == sorted(offsets) and len(offsets) == 20
    # Slot b started long before slot a was through: the slots took turns.
    first_b = next(i for i, (k, _) in enumerate(seen) if k == b)
    assert first_b < 5, seen


def test_key_lane_cache_is_bounded_across_tables_and_agrees_with_the_rule() -> None:
    registry = HandlerRegistry()
    registry.register(r"db\..*", lambda ev: None)
    with LaneDispatcher(registry, DispatchOptions(slots=64, workers=2)) as dispatcher:
        offset = 0
        for table in ("db.a", "db.b", "db.c"):
            batch = []
            for k in range(KEY_SLOT_CACHE):
                batch.append(event(offset, table, (k, "x") if k % 2 else (k,)))
                offset += 1
            dispatcher.submit_many(batch)
        assert dispatcher.drain(timeout=30), dispatcher.failure
        caches = {table: slots.key_slots for table, slots in dispatcher._tables.items()}
        assert 0 < sum(map(len, caches.values())) <= KEY_SLOT_CACHE
        # What submit_many cached (single integers take a shortcut) is the rule's slot.
        for table, cache in caches.items():
            for key, slot in cache.items():
                assert slot == zlib.crc32(ordering_key_bytes(event(0, table, key), "key")) % 64
    special = [(7,), (-3,), (2**70,), (True,), (0,), (8, "x"), ("7",)]
    with LaneDispatcher(registry, DispatchOptions(slots=64, workers=1)) as dispatcher:
        dispatcher.submit_many([event(o, "db.d", key) for o, key in enumerate(special)])
        assert dispatcher.drain(timeout=30), dispatcher.failure
        cache = dispatcher._tables["db.d"].key_slots
        for o, key in enumerate(special):
            ev = event(o, "db.d", key)
            assert cache[key] == zlib.crc32(ordering_key_bytes(ev, "key")) % 64, key


def test_finishing_runs_the_longest_lanes_first_and_keeps_each_lanes_order() -> None:
    """One worker held on a gate while three slots queue 1, 6 and 3 events; after
    `finishing()` the slot with the most events runs first (it bounds the drain), and
    every slot's events still run in submission order."""
    gate, entered = threading.Event(), threading.Event()
    seen: list[tuple] = []
    registry = HandlerRegistry()

    def handler(ev: ChangeEvent) -> None:
        if ev.offset == 0:
            entered.set()
            gate.wait(10)
        seen.append((ev.key, ev.offset))

    registry.register("db.t", handler)
    with LaneDispatcher(registry, DispatchOptions(slots=64, workers=1)) as dispatcher:
        by_lane: dict[int, tuple] = {}
        for k in range(1000):
            probe = event(0, key=(k,))
            by_lane.setdefault(table_slots(probe, "key", 64).slot(probe.key, 64), (k,))
            if len(by_lane) == 4:
                break
        gate_key, short, long, middle = by_lane.values()
        dispatcher.submit_many([event(0, key=gate_key)])
        assert entered.wait(10)
        for offset, k in enumerate([short] + [long] * 6 + [middle] * 3, start=1):
            dispatcher.submit_many([event(offset, key=k)])
        dispatcher.finishing()
        gate.set()
        assert dispatcher.drain(timeout=30), dispatcher.failure
    order = [k for k, _ in seen[1:]]
    assert order == [long] * 6 + [middle] * 3 + [short], seen
    for key in (short, long, middle):
        offsets = [o for k, o in seen if k == key]
        assert offsets == sorted(offsets)


def test_a_handler_blocked_in_one_lane_does_not_hold_back_the_others_when_cheap() -> None:
    """Cheap handlers measured (not eager), then one handler call blocks (a slow I/O call,
    a retry's backoff): the slots that become ready meanwhile still get the idle workers.
    A put wakes nobody while a worker runs, expecting the running one to take the next
    slot within microseconds; the patrol wakes an idle worker when ready slots have waited
    a patrol interval with no worker taking any."""
    release = threading.Event()
    done: list[int] = []
    registry = HandlerRegistry()

    def handler(ev: ChangeEvent) -> None:
        if ev.key == (0,):
            release.wait(10)
        done.append(ev.offset)

    registry.register("db.t", handler)
    with LaneDispatcher(registry, DispatchOptions(slots=64, workers=4)) as dispatcher:
        offset = 0
        while offset < 1000 or dispatcher.handlers_wait():  # until measured cheap
            assert offset < 50_000
            dispatcher.submit_many([event(offset, key=(offset % 20 + 1,))])
            offset += 1
            if offset % 1000 == 0:
                assert dispatcher.drain(timeout=10)
        assert dispatcher.drain(timeout=10)
        blocked = offset
        dispatcher.submit_many([event(blocked, key=(0,))])  # blocks its worker
        later = range(blocked + 1, blocked + 101)
        for offset in later:
            dispatcher.submit_many([event(offset, key=(offset % 20 + 1,))])
        deadline = time.monotonic() + 5
        while len(done) < later[-1] and time.monotonic() < deadline:
            time.sleep(0.005)
        waited = sorted(set(later) - set(done))
        release.set()
        assert dispatcher.drain(timeout=10)
    assert waited == [], f"{len(waited)} events waited for the blocked handler"
