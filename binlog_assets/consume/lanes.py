"""Parallel, per-key ordered dispatch of change events to their handlers: `LaneDispatcher`.

The front over the roles of the consume lanes: `slot_routing` picks an event's key slot,
`scheduling` hands ready slots to worker threads, `barriers` keeps DDL and truncates in
order with their table, and `invoke` calls the handlers. A lane is a unit of concurrency
(a worker thread); a key slot is a serial queue of events, so per ordering key handlers
observe events in position order (invariant 1) under any slot count. A bounded run gives
the dispatcher `lanes × key_slots_per_lane` slots over `defaults.default_workers(lanes)`
workers, and a slot keeps its worker for a time slice at most while others wait.

An event is done when all of its table's handlers finished, or when it was
dead-lettered after its retries. Done offsets go to `on_done_many` in batches; a Kafka
record decoded into several events is reported once, when its last event is done.
`max_in_flight` bounds what the poll thread should submit: it checks `is_full()` and
pauses the partition, and resumes at `below_low_water()`. `submit_many` never blocks.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from queue import Empty
from time import monotonic, perf_counter
from types import TracebackType

from binlog_assets.consume import defaults
from binlog_assets.consume.barriers import BARRIER_OPS, Barriers
from binlog_assets.consume.errors import DeadLetter, DispatcherStopped, ErrorPolicy
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.invoke import (
    HandlerMetrics,
    Invoker,
    Stopping,
    WorkerState,
    merge_metrics,
)
from binlog_assets.consume.scheduling import IDLE, PATROL_SECONDS, ReadyQueue, Slot
from binlog_assets.consume.slot_routing import (
    KEY_SLOT_CACHE,
    ORDERING_KEY,
    ORDERING_MODES,
    TableSlots,
    table_slots,
)
from binlog_assets.formats.event import ChangeEvent

log = logging.getLogger(__name__)

# A worker reports finished events when it has nothing else to run, or after this many
# events or seconds, whichever comes first: the in-flight count and the commit point lag
# by at most that much, and a run of cheap handlers pays one report per batch of slots.
_REPORT_EVENTS = 1024
_REPORT_SECONDS = 0.05
# How long a slot may keep its worker while other slots wait for one (see `_run_slot`).
_SLICE_SECONDS = 0.01


@dataclass(frozen=True)
class DispatchOptions:
    """How a dispatcher runs handlers: `slots` serial slots served by `workers` threads
    (default `defaults.default_workers`), events of one `ordering` key (per table in
    `table_ordering`) in one slot, `max_in_flight` events submitted and not done (the
    poll resumes below `low_water`, default half), handler calls on `handler_threads`
    threads (default one per worker) stopped after `handler_timeout_seconds`."""

    slots: int = defaults.LANES  # one key slot per default lane
    workers: int | None = None
    ordering: str = ORDERING_KEY
    table_ordering: Mapping[str, str] | None = None
    max_in_flight: int = defaults.MAX_IN_FLIGHT
    low_water: int | None = None
    handler_threads: int | None = None
    handler_timeout_seconds: float | None = None


class LaneDispatcher:
    """Runs each event's handlers on its slot; see the module docstring.

    `submit_many` is called from one thread (the poll thread), after the offsets were
    given to the tracker as received. `on_done_many` and `dead_letter` are called from
    worker threads, possibly concurrently; `OffsetTracker.done_many` is safe for that.
    One dispatcher serves one topic-partition: offsets identify its events.
    """

    def __init__(self, registry: HandlerRegistry, options: DispatchOptions | None = None, *,
                 on_done_many: Callable[[list[int]], None] | None = None,
                 policy: ErrorPolicy | None = None,
                 dead_letter: DeadLetter | None = None) -> None:
        o = options or DispatchOptions()
        slots, workers, ordering = o.slots, o.workers, o.ordering
        max_in_flight, low_water, table_ordering = o.max_in_flight, o.low_water, o.table_ordering
        _require_count("slots", slots)
        workers = defaults.default_workers(slots) if workers is None else workers
        _require_count("workers", workers)
        _require_count("max_in_flight", max_in_flight)
        low_water = max_in_flight // 2 if low_water is None else low_water
        if not isinstance(low_water, int) or not 0 <= low_water < max_in_flight:
            raise ValueError(
                f"LaneDispatcher low_water must be an integer in [0, max_in_flight), "
                f"got {low_water!r}"
            )
        _require_ordering("ordering", ordering)
        for table, mode in (table_ordering or {}).items():
            _require_ordering(f"table_ordering[{table!r}]", mode)

        self._registry = registry
        self._slot_count = slots
        self._on_done_many = on_done_many
        self._ordering = ordering
        self._table_ordering = dict(table_ordering or {})
        self._max_in_flight = max_in_flight
        self._low_water = low_water
        self._policy = policy if policy is not None else ErrorPolicy()

        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # in-flight transitions, halts
        self._stop = threading.Event()  # wakes retry backoffs on close or failure
        self._halted = False
        self._stopping = False
        self._failure: BaseException | None = None
        self._in_flight = 0
        # Kafka records with several events (a Canal message's rows): offset -> events left.
        self._multi: dict[int, int] = {}
        self._last_offset: int | None = None
        self._tables: dict[str, TableSlots] = {}
        self._cached_keys = 0  # keys in the tables' key -> slot caches
        self._slots = [Slot(i) for i in range(slots)]
        self._ready = ReadyQueue(workers)
        self._barriers = Barriers(self._slots, self._ready)
        self._invoker = Invoker(
            policy=self._policy, dead_letter=dead_letter, stop=self._stop, halt=self._halt,
            handler_threads=o.handler_threads or workers,
            timeout_seconds=o.handler_timeout_seconds)
        self._workers = [WorkerState() for _ in range(workers)]
        self._threads = [
            threading.Thread(
                target=self._work, args=(state,), name=f"binlake-lane-worker-{i}", daemon=True
            )
            for i, state in enumerate(self._workers)
        ]
        for thread in self._threads:
            thread.start()
        self._patrol = threading.Thread(
            target=self._run_patrol, name="binlake-lane-patrol", daemon=True)
        self._patrol.start()

    def report_done_to(self, on_done_many: Callable[[list[int]], None]) -> None:
        """Where done offsets go, when the tracker exists only after the dispatcher was
        started (a run overlaps the two); set it before the first submit."""
        self._on_done_many = on_done_many

    # -- the poll thread's side -------------------------------------------------------
    def submit(self, event: ChangeEvent) -> None:
        self.submit_many((event,))

    def submit_many(self, events: Sequence[ChangeEvent]) -> None:
        """Queue events in poll order; the events of one Kafka record go in one call."""
        if self._halted:
            raise DispatcherStopped("the dispatcher is stopped") from self._failure
        if not events:
            return
        if events[0].offset == self._last_offset:
            raise ValueError(
                f"offset {events[0].offset} continues from the previous submit_many: the "
                f"events of one Kafka record must be submitted together"
            )
        tables = self._tables
        crc32 = zlib.crc32
        slots = self._slot_count
        barriers = self._barriers.by_table
        per_slot: dict[int, list[ChangeEvent]] = {}
        multi: dict[int, int] = {}
        special = False
        previous = None
        cached = self._cached_keys
        last_table = None
        fixed = seed = table_slot = 0
        key_slots: dict[tuple, int] = {}
        for event in events:
            table = event.table
            if table != last_table:
                # Records of one table come in runs: look its slots up once per run.
                choice = tables.get(table)
                if choice is None:
                    choice = self._table_slots(event)
                fixed, seed, table_slot, key_slots = choice
                last_table = table
                if barriers and table in barriers:
                    special = True
            if fixed >= 0:
                slot = fixed
            else:
                key = event.key
                slot = key_slots.get(key)
                if slot is None:
                    if not key:
                        slot = table_slot
                    elif len(key) == 1 and type(key[0]) is int:
                        # The same bytes as repr(key).encode(), at a third of the cost.
                        slot = crc32(b"(%d,)" % key, seed) % slots
                    else:
                        slot = crc32(repr(key).encode(), seed) % slots
                    cached += 1
                    if cached > KEY_SLOT_CACHE:
                        for other in tables.values():
                            other.key_slots.clear()
                        cached = 1
                    key_slots[key] = slot
                if event.op in BARRIER_OPS:
                    special = True
            offset = event.offset
            if offset == previous:
                multi[offset] = multi.get(offset, 1) + 1
            previous = offset
            batch = per_slot.get(slot)
            if batch is None:
                per_slot[slot] = [event]
            else:
                batch.append(event)
        self._last_offset = previous
        self._cached_keys = cached
        with self._lock:
            self._in_flight += len(events)
            if multi:
                self._multi.update(multi)
            if special:
                self._barriers.enqueue_in_order(events, tables)
            else:
                self._enqueue(per_slot)

    def handlers_wait(self) -> bool:
        """True while the handlers' measured time per event is at least 100 us (I/O, not
        computation), and before anything was measured: the workers are then mostly
        waiting, and what holds them up is the GIL when they come back."""
        return self._ready.eager

    def in_flight(self) -> int:
        """Events submitted and not yet done."""
        return self._in_flight

    def is_full(self) -> bool:
        """True at `max_in_flight`: the poll thread should pause the partition."""
        return self._in_flight >= self._max_in_flight

    def below_low_water(self) -> bool:
        """True at or below the low-water mark: a paused partition may resume."""
        return self._in_flight <= self._low_water

    def wait_below_low_water(self, timeout: float | None = None) -> bool:
        """Wait until `below_low_water()` (or the dispatcher stopped); False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._in_flight <= self._low_water or self._halted, timeout
            )

    def finishing(self) -> None:
        """Nothing more will be submitted: run the slots with the most queued events first
        from now on (see `ReadyQueue`), so the drain ends sooner. Submitting still works;
        it only gives up the first-in, first-out order the commit point prefers."""
        with self._lock:
            self._ready.longest_first()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted is done. False on timeout or when stopped."""
        with self._changed:
            self._changed.wait_for(lambda: self._in_flight == 0 or self._halted, timeout)
            return self._in_flight == 0 and self._failure is None

    def stop(self) -> None:
        """Tell the workers to stop, without waiting for them (`close` waits). Events not
        yet started are dropped, and so never done. A drained run stops its workers
        before its final commit, so that they exit while the commit is in flight."""
        if self._stopping:
            return
        self._stopping = True
        self._halt(None)
        for _ in self._threads:
            self._ready.put(None)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the workers and wait for them. Events not yet started are dropped."""
        self.stop()
        for thread in (*self._threads, self._patrol):
            thread.join(timeout)
        self._invoker.close()

    def __enter__(self) -> LaneDispatcher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def failure(self) -> BaseException | None:
        """The strict-mode (or callback) failure that stopped the dispatcher, if any."""
        return self._failure

    @property
    def dead_lettered(self) -> int:
        return sum(w.dead_lettered for w in self._workers)

    @property
    def skipped(self) -> int:
        """Events of tables that no handler is registered for."""
        return sum(w.skipped for w in self._workers)

    @property
    def breakers_open(self) -> int:
        """Keys whose later events are dead-lettered without retries."""
        return sum(len(slot.breaker.open_keys()) for slot in self._slots
                   if slot.breaker is not None)

    def handler_metrics(self) -> dict[str, HandlerMetrics]:
        """Per handler name: events, errors, retries, dead letters, timeouts, latency."""
        return merge_metrics(self._workers)

    # -- queueing (under the lock) ----------------------------------------------------
    def _table_slots(self, event: ChangeEvent) -> TableSlots:
        table = event.table
        choice = self._tables[table] = table_slots(
            event, self._table_ordering.get(table, self._ordering), self._slot_count)
        return choice

    def _enqueue(self, per_slot: dict[int, list[ChangeEvent]]) -> None:
        slots, schedule = self._slots, self._ready.schedule
        for index, batch in per_slot.items():
            schedule(slots[index], batch)

    def _halt(self, failure: BaseException | None) -> None:
        with self._lock:
            if failure is not None and self._failure is None:
                self._failure = failure
            self._halted = True
            self._stop.set()
            self._changed.notify_all()

    def _run_patrol(self) -> None:
        """Every PATROL_SECONDS until stopped: wake an idle worker for ready slots that
        no worker takes (see `ReadyQueue.patrol`)."""
        while not self._stop.wait(PATROL_SECONDS):
            self._ready.patrol()
            self._invoker.watch(self._workers)

    # -- the workers' side ------------------------------------------------------------
    def _work(self, worker: WorkerState) -> None:
        wake = threading.Lock()
        wake.acquire()  # held while this worker waits; `ReadyQueue.put` releases it
        get, get_nowait = self._ready.get, self._ready.get_nowait
        done: list[int] = []  # one offset per finished event, not yet reported
        since = 0.0  # when the oldest of them could have finished
        try:
            while True:
                # Finished events are reported in batches: one tracker call and one
                # in-flight update for several slots rather than one per slot. They are
                # reported before this worker would wait, and before it runs another slot
                # once they are _REPORT_SECONDS old or _REPORT_EVENTS many.
                if not done:
                    slot = get(wake)
                    since = monotonic()
                else:
                    try:
                        slot = get_nowait()
                    except Empty:
                        self._report(done)
                        slot = get(wake)
                        since = monotonic()
                    else:
                        if (len(done) >= _REPORT_EVENTS
                                or monotonic() - since >= _REPORT_SECONDS):
                            self._report(done)
                            since = monotonic()
                if slot is None:
                    break
                try:
                    self._run_slot(slot, worker, done)
                except BaseException as exc:
                    # A dispatcher bug: stop rather than hang. Once stopping, an interrupted
                    # fan-out (its pool futures cancelled by close) is expected, not a
                    # failure.
                    if not self._halted:
                        self._halt(exc)
        finally:
            if done:
                self._report(done)

    def _run_slot(self, slot: Slot, worker: WorkerState, done: list[int]) -> None:
        with self._lock:
            entries, slot.entries = slot.entries, []
        parked = False
        rest: list = []  # entries not run when the slot gave its worker up
        # A slot keeps its worker for one time slice while other slots wait: slow handlers
        # then take turns, and a long slot does not hold the run's tail on one thread.
        began = monotonic()
        deadline = began + _SLICE_SECONDS
        finished = len(done)
        try:
            for i, entry in enumerate(entries):
                if self._halted:
                    break
                if type(entry) is list:
                    stopped = self._run_batch(slot, entry, done, worker, deadline)
                    if stopped is not None:
                        rest = [entry[stopped:], *entries[i + 1 :]]
                        break
                else:
                    with self._lock:
                        parked = self._barriers.control(slot, entry, entries, i)
                    if parked:
                        break
        except Stopping:
            pass
        finally:
            finished = len(done) - finished
            if finished:
                self._ready.measured((monotonic() - began) / finished)
            with self._lock:
                if not parked:
                    if rest:
                        # Back to the end of the ready queue, its order kept: it is still
                        # this slot's turn only, and no other worker can have run it.
                        slot.entries = rest + slot.entries
                    if slot.entries and not self._halted:
                        self._ready.put(slot)
                    else:
                        slot.state = IDLE

    def _run_batch(
        self,
        slot: Slot,
        batch: list[ChangeEvent],
        done: list[int],
        worker: WorkerState,
        deadline: float,
    ) -> int | None:
        """Run `batch` in order. Returns None when it ran to its end (or the dispatcher
        stopped), else the index of the first event not run: the time slice is over and
        other slots are waiting for a worker."""
        handlers_for = self._registry.handlers_for
        invoker = self._invoker
        waiting = self._ready.qsize
        append = done.append
        current = worker.current
        fast = 0
        stopped = None
        table = handlers = fn = tally = name = None
        batched = False
        resume = 0  # events before it were handled by a batch call
        try:
            for index, event in enumerate(batch):
                if index < resume:
                    continue
                if self._halted:
                    break
                if monotonic() >= deadline and index and waiting():
                    stopped = index
                    break
                if event.table != table:
                    if fast:  # the previous table's handler gets its own events
                        tally.events += fast
                        fast = 0
                    table = event.table
                    handlers = handlers_for(table)
                    single = handlers[0] if len(handlers) == 1 and not handlers[0].batch else None
                    fn = single.fn if single is not None else None
                    if single is not None:
                        name, tally = single.name, worker.tally(single)
                    batched = any(h.batch for h in handlers)
                if fn is not None and slot.breaker is None:
                    # The common case: one handler, no failure, no breaker to consult.
                    current[0], current[1] = name, event
                    began = current[2] = perf_counter()
                    try:
                        fn(event)
                    except BaseException as exc:
                        current[2] = 0.0
                        tally.timed(perf_counter() - began)
                        if not invoker.handle(slot, event, handlers, exc, worker):
                            break
                    else:
                        current[2] = 0.0
                        tally.timed(perf_counter() - began)
                        fast += 1
                elif batched and slot.breaker is None:
                    resume = invoker.handle_run(slot, batch, index, handlers, worker, done)
                    if resume < 0:
                        return None
                    continue
                elif not invoker.handle(slot, event, handlers, None, worker):
                    break
                append(event.offset)
        finally:
            if fast:
                tally.events += fast
        return stopped

    def _report(self, done: list[int]) -> None:
        """Report finished events (one offset each) as done offsets; empties `done`."""
        finished = len(done)
        offsets = done[:]
        done.clear()
        if self._multi:
            with self._lock:
                offsets = self._settle_multi(offsets)
        if offsets and self._on_done_many is not None:
            try:
                self._on_done_many(offsets)
            except BaseException as exc:
                exc.add_note(
                    f"binlake: on_done_many failed for offsets {offsets[0]}..{offsets[-1]}"
                )
                self._halt(exc)
        with self._lock:
            before = self._in_flight
            self._in_flight = after = before - finished
            if after == 0 or after <= self._low_water < before:
                self._changed.notify_all()

    def _settle_multi(self, done: list[int]) -> list[int]:
        """Keep only offsets whose record has no event left (under the lock)."""
        multi = self._multi
        settled = []
        for offset in done:
            left = multi.get(offset)
            if left is None:
                settled.append(offset)
            elif left > 1:
                multi[offset] = left - 1
            else:
                del multi[offset]
                settled.append(offset)
        return settled


def _require_count(field: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"LaneDispatcher {field} must be an integer >= 1, got {value!r}")


def _require_ordering(field: str, value: object) -> None:
    if value not in ORDERING_MODES:
        raise ValueError(f"LaneDispatcher {field} must be one of {ORDERING_MODES}, got {value!r}")
