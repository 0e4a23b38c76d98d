"""Parallel, per-key ordered dispatch of change events to their handlers: `LaneDispatcher`.

An event's lane is `crc32(ordering key bytes) % lanes` (stable across processes, unlike
Python's salted `hash()`), and a lane is serial: its events run one after another, in
submission order, so per ordering key handlers observe events in position order
(invariant 1) under any lane count. Lanes are many and cheap; `workers` threads run them,
a lane on at most one worker at a time. Having more lanes than workers is what keeps
workers busy when keys hash unevenly: an idle worker takes any lane with work. A bounded
run gives the dispatcher `lanes × key_slots_per_lane` of these serial lanes (the "key
slots" of the configuration, where `lanes` means parallelism) over `min(lanes, 64)`
workers. A lane keeps its worker for a time slice at most while other lanes wait, then
goes to the back of the queue with the rest of its events, still in order.

A DDL event is a barrier for its table. Under `table` or `partition` ordering all of the
table's events share the DDL's lane, so lane order already is the barrier. Under `key`
ordering the table is spread over lanes, so the dispatcher puts a fence in every busy
lane, runs the DDL (on the table's lane) once every fence is passed, and gates every lane
that receives a later event of the table until the DDL is done. A lane waiting at a gate
is parked, not blocking a worker, and every wait points at earlier submissions, so the
barrier cannot deadlock with any number of workers.

An event is done when all of its table's handlers finished (they run concurrently when
there are several), or when it was dead-lettered after its retries (see `errors.py`).
Done offsets go to `on_done_many` in batches (a worker reports before it waits for work,
or every 50 ms / 1,024 events); a Kafka record decoded into several events is reported
once, when its last event is done. `max_in_flight` bounds what the poll
thread should submit: it checks `is_full()` and pauses the partition, and resumes at
`below_low_water()`. `submit_many` itself never blocks.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from heapq import heapify, heappop, heappush
from queue import Empty
from time import monotonic, perf_counter
from types import TracebackType

from binlog_assets.consume.errors import DeadLetter, DispatcherStopped, ErrorPolicy, KeyBreaker
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.invoke import (
    BATCH_MAX_EVENTS,
    HandlerMetrics,
    Invoker,
    Stopping,
    WorkerState,
    merge_metrics,
)
from binlog_assets.formats.event import OP_DDL, OP_TRUNCATE, ChangeEvent

log = logging.getLogger(__name__)

ORDERING_PARTITION = "partition"
ORDERING_TABLE = "table"
ORDERING_KEY = "key"
ORDERING_MODES = (ORDERING_PARTITION, ORDERING_TABLE, ORDERING_KEY)

MAX_DEFAULT_WORKERS = 64

# Hashing a key costs more than looking its lane up, and hot keys repeat. The caches (one
# per table) hold at most this many keys in all and are cleared when full, which bounds
# them without any bookkeeping per hit. 65,536 per table cost 12 MiB of a run's peak on a
# million-key backlog; a miss costs about 0.3 us (single-integer keys) to 0.8 us. Keyed by
# equality, so 1 and 1.0 would share a lane; a decoder gives a column one type anyway.
_KEY_LANE_CACHE = 4096

# A worker reports finished events when it has nothing else to run, or after this many
# events or seconds, whichever comes first: the in-flight count and the commit point lag
# by at most that much, and a run of cheap handlers pays one report per batch of lanes.
_REPORT_EVENTS = 1024
_REPORT_SECONDS = 0.05
# How long a lane may keep its worker while other lanes wait for one (see `_run_lane`).
_SLICE_SECONDS = 0.01
# Handlers taking at least this long per event (a moving average) get a waiting worker
# woken for every lane that becomes ready; cheaper ones only when no worker is running or
# the ready lanes pile up past _LAZY_BACKLOG (see `_ReadyQueue`).
_EAGER_EVENT_SECONDS = 0.0001
_LAZY_BACKLOG = 256
# How often the patrol looks for ready lanes that no worker took, and after how many
# looks in a row it wakes a worker for them (see `_ReadyQueue`).
_PATROL_SECONDS = 0.02
_PATROL_LOOKS = 2

# Lane states, changed only under the dispatcher lock.
_IDLE = 0  # no entries, not on the ready queue, no worker on it
_SCHEDULED = 1  # on the ready queue or being run by a worker
_PARKED = 2  # waiting for a barrier; the barrier puts it back on the ready queue
# A DDL and a truncate carry no key: each runs on its table's lane, after every earlier
# event of its table and before every later one, whatever lane those keys hash to.
_BARRIER_OPS = frozenset({OP_DDL, OP_TRUNCATE})

# Barrier control entries, queued in lanes between event batches.
_FENCE = 0  # this lane has finished everything submitted before the DDL
_AWAIT_FENCES = 1  # DDL lane: wait until every fence is passed
_GATE = 2  # wait until the DDL is done
_RELEASE = 3  # the DDL is done


# Per table: (fixed lane, or -1 under key ordering; crc32 of the key prefix, which the
# key's bytes continue; the table's own lane; key -> lane cache).
_Route = tuple[int, int, int, dict[tuple, int]]


def ordering_key_bytes(event: ChangeEvent, mode: str) -> bytes:
    """The canonical bytes whose crc32 picks an event's lane.

    `partition`: topic and partition; `table`: the table; `key`: the table and `repr` of
    the key values (deterministic for the int, str, Decimal, bytes and datetime values
    the decoders produce; a key without values falls back to its table). The dispatcher
    computes the same crc32 incrementally.
    """
    if mode == ORDERING_PARTITION:
        return f"partition\0{event.topic}\0{event.partition}".encode()
    if mode == ORDERING_KEY and event.key:
        return _key_prefix(event.table) + repr(event.key).encode()
    if mode in (ORDERING_KEY, ORDERING_TABLE):
        return _table_bytes(event.table)
    raise ValueError(f"ordering must be one of {ORDERING_MODES}, got {mode!r}")


class LaneDispatcher:
    """Runs each event's handlers on its lane; see the module docstring.

    `submit_many` is called from one thread (the poll thread), after the offsets were
    given to the tracker as received. `on_done_many` and `dead_letter` are called from
    worker threads, possibly concurrently; `OffsetTracker.done_many` is safe for that.
    One dispatcher serves one topic-partition: offsets identify its events.
    """

    def __init__(
        self,
        registry: HandlerRegistry,
        *,
        lanes: int = 16,
        workers: int | None = None,
        on_done_many: Callable[[list[int]], None] | None = None,
        ordering: str = ORDERING_KEY,
        table_ordering: Mapping[str, str] | None = None,
        max_in_flight: int = 10_000,
        low_water: int | None = None,
        policy: ErrorPolicy | None = None,
        dead_letter: DeadLetter | None = None,
        handler_threads: int | None = None,
        handler_timeout_seconds: float | None = None,
    ) -> None:
        _require_count("lanes", lanes)
        workers = min(lanes, MAX_DEFAULT_WORKERS) if workers is None else workers
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
        self._lane_count = lanes
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
        self._routes: dict[str, _Route] = {}
        self._cached_keys = 0  # keys in the routes' key -> lane caches
        self._barriers: dict[str, _Barrier] = {}  # table -> its latest DDL barrier
        self._lanes = [_Lane(i) for i in range(lanes)]
        self._ready = _ReadyQueue(workers)
        # Moving average of a lane's handling time per event; None until the first lane
        # run is measured (the handlers count as waiting until then).
        self._event_seconds: float | None = None
        self._invoker = Invoker(
            policy=self._policy, dead_letter=dead_letter, stop=self._stop, halt=self._halt,
            handler_threads=handler_threads or workers, timeout_seconds=handler_timeout_seconds)
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
        routes = self._routes
        crc32 = zlib.crc32
        lanes = self._lane_count
        barriers = self._barriers
        per_lane: dict[int, list[ChangeEvent]] = {}
        multi: dict[int, int] = {}
        special = False
        previous = None
        cached = self._cached_keys
        last_table = None
        fixed = seed = table_lane = 0
        key_lanes: dict[tuple, int] = {}
        for event in events:
            table = event.table
            if table != last_table:
                # Records of one table come in runs: look its route up once per run.
                route = routes.get(table)
                if route is None:
                    route = self._route(event)
                fixed, seed, table_lane, key_lanes = route
                last_table = table
                if barriers and table in barriers:
                    special = True
            if fixed >= 0:
                lane = fixed
            else:
                key = event.key
                lane = key_lanes.get(key)
                if lane is None:
                    if not key:
                        lane = table_lane
                    elif len(key) == 1 and type(key[0]) is int:
                        # The same bytes as repr(key).encode(), at a third of the cost.
                        lane = crc32(b"(%d,)" % key, seed) % lanes
                    else:
                        lane = crc32(repr(key).encode(), seed) % lanes
                    cached += 1
                    if cached > _KEY_LANE_CACHE:
                        for other in routes.values():
                            other[3].clear()
                        cached = 1
                    key_lanes[key] = lane
                if event.op in _BARRIER_OPS:
                    special = True
            offset = event.offset
            if offset == previous:
                multi[offset] = multi.get(offset, 1) + 1
            previous = offset
            batch = per_lane.get(lane)
            if batch is None:
                per_lane[lane] = [event]
            else:
                batch.append(event)
        self._last_offset = previous
        self._cached_keys = cached
        with self._lock:
            self._in_flight += len(events)
            if multi:
                self._multi.update(multi)
            if special:
                self._enqueue_in_order(events)
            else:
                self._enqueue(per_lane)

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
        """Nothing more will be submitted: run the lanes with the most queued events first
        from now on (see `_ReadyQueue`), so the drain ends sooner. Submitting still works;
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
        return sum(len(lane.breaker.open_keys()) for lane in self._lanes
                   if lane.breaker is not None)

    def handler_metrics(self) -> dict[str, HandlerMetrics]:
        """Per handler name: events, errors, retries, dead letters, timeouts, latency."""
        return merge_metrics(self._workers)

    def lane_of(self, event: ChangeEvent) -> int:
        """The lane `event` runs on: crc32(ordering_key_bytes(event, mode)) % lanes.

        Key lanes are cached by key equality, as `submit_many` does, so both always agree.
        """
        fixed, seed, table_lane, key_lanes = self._routes.get(event.table) or self._route(event)
        if fixed >= 0:
            return fixed
        key = event.key
        if not key:
            return table_lane
        lane = key_lanes.get(key)
        if lane is None:
            lane = zlib.crc32(repr(key).encode(), seed) % self._lane_count
        return lane

    # -- queueing (under the lock) ----------------------------------------------------
    def _route(self, event: ChangeEvent) -> _Route:
        table = event.table
        mode = self._table_ordering.get(table, self._ordering)
        table_lane = zlib.crc32(_table_bytes(table)) % self._lane_count
        if mode == ORDERING_KEY:
            route = (-1, zlib.crc32(_key_prefix(table)), table_lane, {})
        elif mode == ORDERING_TABLE:
            route = (table_lane, 0, table_lane, {})
        else:
            lane = zlib.crc32(ordering_key_bytes(event, ORDERING_PARTITION)) % self._lane_count
            route = (lane, 0, table_lane, {})
        self._routes[table] = route
        return route

    def _enqueue(self, per_lane: dict[int, list[ChangeEvent]]) -> None:
        lanes = self._lanes
        for index, batch in per_lane.items():
            self._append(lanes[index], batch)

    def _append(self, lane: _Lane, entry: list[ChangeEvent] | _Control) -> None:
        entries = lane.entries
        if type(entry) is list and entries and type(entries[-1]) is list:
            # Fewer, longer batches: the worker's per-batch cost is paid once.
            entries[-1].extend(entry)
        else:
            entries.append(entry)
        if lane.state == _IDLE:
            lane.state = _SCHEDULED
            self._ready.put(lane)

    def _enqueue_in_order(self, events: Sequence[ChangeEvent]) -> None:
        """The slow path for batches with a key-ordered DDL or a table behind a barrier."""
        held: dict[int, list[ChangeEvent]] = {}  # per lane, not yet appended
        for event in events:
            table = event.table
            barrier = self._barriers.get(table)
            if barrier is not None and barrier.done:
                del self._barriers[table]
                barrier = None
            lane = self.lane_of(event)
            if event.op in _BARRIER_OPS and self._routes[table][0] < 0:
                # Fences must follow everything submitted before the DDL, in every lane.
                self._enqueue(held)
                held = {}
                self._place_barrier(event, self._routes[table][2])
                continue
            if barrier is not None and lane != barrier.lane and lane not in barrier.gated:
                if lane in held:
                    self._append(self._lanes[lane], held.pop(lane))
                self._append(self._lanes[lane], _Control(_GATE, barrier))
                barrier.gated.add(lane)
            held.setdefault(lane, []).append(event)
        self._enqueue(held)

    def _place_barrier(self, event: ChangeEvent, ddl_lane: int) -> None:
        barrier = _Barrier(event.table, ddl_lane)
        for lane in self._lanes:
            # An idle lane has finished everything submitted so far: no fence needed.
            if lane.index != ddl_lane and lane.state != _IDLE:
                self._append(lane, _Control(_FENCE, barrier))
                barrier.fences_left += 1
        barrier.fenced = barrier.fences_left == 0
        lane = self._lanes[ddl_lane]
        self._append(lane, _Control(_AWAIT_FENCES, barrier))
        self._append(lane, [event])
        self._append(lane, _Control(_RELEASE, barrier))
        self._barriers[event.table] = barrier

    def _wake(self, lanes: list[_Lane]) -> None:
        for lane in lanes:
            lane.state = _SCHEDULED
            self._ready.put(lane)
        lanes.clear()

    def _halt(self, failure: BaseException | None) -> None:
        with self._lock:
            if failure is not None and self._failure is None:
                self._failure = failure
            self._halted = True
            self._stop.set()
            self._changed.notify_all()

    def _run_patrol(self) -> None:
        """Every _PATROL_SECONDS until stopped: wake an idle worker for ready lanes that
        no worker takes (see `_ReadyQueue.patrol`)."""
        while not self._stop.wait(_PATROL_SECONDS):
            self._ready.patrol()
            self._invoker.watch(self._workers)

    # -- the workers' side ------------------------------------------------------------
    def _work(self, worker: WorkerState) -> None:
        wake = threading.Lock()
        wake.acquire()  # held while this worker waits; `_ReadyQueue.put` releases it
        get, get_nowait = self._ready.get, self._ready.get_nowait
        done: list[int] = []  # one offset per finished event, not yet reported
        since = 0.0  # when the oldest of them could have finished
        try:
            while True:
                # Finished events are reported in batches: one tracker call and one
                # in-flight update for several lanes rather than one per lane. They are
                # reported before this worker would wait, and before it runs another lane
                # once they are _REPORT_SECONDS old or _REPORT_EVENTS many.
                if not done:
                    lane = get(wake)
                    since = monotonic()
                else:
                    try:
                        lane = get_nowait()
                    except Empty:
                        self._report(done)
                        lane = get(wake)
                        since = monotonic()
                    else:
                        if (len(done) >= _REPORT_EVENTS
                                or monotonic() - since >= _REPORT_SECONDS):
                            self._report(done)
                            since = monotonic()
                if lane is None:
                    break
                try:
                    self._run_lane(lane, worker, done)
                except BaseException as exc:
                    # A dispatcher bug: stop rather than hang. Once stopping, an interrupted
                    # fan-out (its pool futures cancelled by close) is expected, not a
                    # failure.
                    if not self._halted:
                        self._halt(exc)
        finally:
            if done:
                self._report(done)

    def _run_lane(self, lane: _Lane, worker: WorkerState, done: list[int]) -> None:
        with self._lock:
            entries, lane.entries = lane.entries, []
        parked = False
        rest: list = []  # entries not run when the lane gave its worker up
        # A lane keeps its worker for one time slice while other lanes wait: slow handlers
        # then take turns, and a long lane no longer holds the run's tail on one thread.
        began = monotonic()
        deadline = began + _SLICE_SECONDS
        finished = len(done)
        try:
            for i, entry in enumerate(entries):
                if self._halted:
                    break
                if type(entry) is list:
                    stopped = self._run_batch(lane, entry, done, worker, deadline)
                    if stopped is not None:
                        rest = [entry[stopped:], *entries[i + 1 :]]
                        break
                elif self._control(lane, entry, entries, i):
                    parked = True
                    break
        except Stopping:
            pass
        finally:
            finished = len(done) - finished
            if finished:
                # Unlocked on purpose: a lost update between workers only delays the
                # average by one sample.
                sample = (monotonic() - began) / finished
                average = self._event_seconds
                average = sample if average is None else average + 0.2 * (sample - average)
                self._event_seconds = average
                self._ready.eager = average >= _EAGER_EVENT_SECONDS
            with self._lock:
                if not parked:
                    if rest:
                        # Back to the end of the ready queue, its order kept: it is still
                        # this lane's turn only, and no other worker can have run it.
                        lane.entries = rest + lane.entries
                    if lane.entries and not self._halted:
                        self._ready.put(lane)
                    else:
                        lane.state = _IDLE

    def _run_batch(
        self,
        lane: _Lane,
        batch: list[ChangeEvent],
        done: list[int],
        worker: WorkerState,
        deadline: float,
    ) -> int | None:
        """Run `batch` in order. Returns None when it ran to its end (or the dispatcher
        stopped), else the index of the first event not run: the time slice is over and
        other lanes are waiting for a worker."""
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
                    table = event.table
                    handlers = handlers_for(table)
                    single = handlers[0] if len(handlers) == 1 and not handlers[0].batch else None
                    fn = single.fn if single is not None else None
                    if single is not None:
                        name, tally = single.name, worker.tally(single)
                    batched = any(h.batch for h in handlers)
                if fn is not None and lane.breaker is None:
                    # The common case: one handler, no failure, no breaker to consult.
                    current[0], current[1] = name, event
                    began = current[2] = perf_counter()
                    try:
                        fn(event)
                    except BaseException as exc:
                        current[2] = 0.0
                        tally.timed(perf_counter() - began)
                        if not invoker.handle(lane, event, handlers, exc, worker):
                            break
                    else:
                        current[2] = 0.0
                        tally.timed(perf_counter() - began)
                        fast += 1
                elif batched and lane.breaker is None:
                    resume = _same_table_end(batch, index, table)
                    run = batch[index:resume]
                    if not invoker.handle_many(run, handlers, worker):
                        # Replayed one at a time: only the events that fail dead-letter.
                        for one in run:
                            if not invoker.handle(lane, one, handlers, None, worker):
                                return None
                            append(one.offset)
                        continue
                    done.extend([e.offset for e in run])
                    continue
                elif not invoker.handle(lane, event, handlers, None, worker):
                    break
                append(event.offset)
        finally:
            if fast:
                tally.events += fast
        return stopped

    def _control(self, lane: _Lane, entry: _Control, entries: list, i: int) -> bool:
        """Apply a barrier entry; True when the lane was parked to wait for the barrier."""
        barrier = entry.barrier
        with self._lock:
            if entry.kind == _FENCE:
                barrier.fences_left -= 1
                if barrier.fences_left == 0:
                    barrier.fenced = True
                    self._wake(barrier.fence_waiters)
                return False
            if entry.kind == _RELEASE:
                barrier.done = True
                self._wake(barrier.done_waiters)
                return False
            if entry.kind == _AWAIT_FENCES:
                ready, waiters = barrier.fenced, barrier.fence_waiters
            else:
                ready, waiters = barrier.done, barrier.done_waiters
            if ready:
                return False
            # The entry itself stays first, so the lane re-checks it when woken.
            lane.entries = entries[i:] + lane.entries
            lane.state = _PARKED
            waiters.append(lane)
            return True

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


class _ReadyQueue:
    """Lanes ready to run, and the workers waiting for one.

    Each waiting worker blocks on a lock of its own, and a `put` releases exactly one of
    them. `queue.SimpleQueue` wakes its waiters through one shared binary lock: a burst
    of puts from the poll thread woke a single worker, and the rest waited until the
    poll thread stopped decoding (measured: 64 lanes put at once, 1 worker running after
    5 ms, the other 63 after 40 ms; here all 64 within 6-12 ms, the GIL's switch
    interval being the rest). That was most of a run's slow start with slow handlers.

    Waking a worker pays off when handlers wait (on I/O): every ready lane then gets a
    worker at once. With cheap handlers it does not: a running worker takes the next lane
    within microseconds, and every extra thread woken only competes with the poll thread
    (the bottleneck then) for the GIL. Measured on 1M records with a no-op handler:
    binlake/baseline 0.59 when a burst woke one worker, 0.50 when it woke one per lane.
    So `eager` (set from the handlers' measured time per event) decides: eager, a put
    wakes a waiting worker; otherwise only when no worker is running, when the backlog
    passes _LAZY_BACKLOG, or to stop one. A running worker is not always about to take
    the next lane, though: its handler call may block (a slow I/O call among cheap ones,
    a retry's backoff), and with fewer than _LAZY_BACKLOG ready lanes nothing would wake
    the idle workers until it returned. The dispatcher's patrol calls `patrol()` every
    _PATROL_SECONDS: when lanes stay ready and untaken for _PATROL_LOOKS calls, it wakes
    an idle worker.

    Lanes come out first in, first out: the oldest queued events hold the commit point
    back, so they go first. After `longest_first()` (nothing more will be submitted)
    the lane with the most queued events comes out first instead: the longest-processing-
    time rule, which shortens the drain (simulated on the slow-handler benchmark's 3,000
    events over 512 key slots and 64 workers: 265 ms first in, first out, 240 ms longest
    first, against 239 ms of work per worker).
    """

    __slots__ = ("_heap", "_idle", "_items", "_mutex", "_patrolled", "_seq", "_stale_looks",
                 "_taken", "_workers", "eager")

    def __init__(self, workers: int) -> None:
        self._mutex = threading.Lock()
        self._items: deque[_Lane | None] = deque()
        self._heap: list[tuple[float, int, _Lane | None]] | None = None  # longest first
        self._seq = 0
        self._idle: list[threading.Lock] = []  # wake locks of waiting workers, all held
        self._workers = workers
        self._taken = 0  # items taken by workers so far
        self._patrolled = 0  # _taken at the last patrol
        self._stale_looks = 0  # patrols in a row that found ready items and no take
        self.eager = True  # until the handlers are measured

    def put(self, item: _Lane | None) -> None:
        """Queue `item`; callers that change lanes hold the dispatcher lock."""
        with self._mutex:
            if self._heap is None:
                self._items.append(item)
            else:
                self._seq += 1
                heappush(self._heap, (_queued_first(item), self._seq, item))
            idle = self._idle
            wake = idle.pop() if idle and (
                self.eager or item is None or len(idle) == self._workers
                or self.qsize() > _LAZY_BACKLOG) else None
        if wake is not None:
            wake.release()

    def get(self, wake: threading.Lock) -> _Lane | None:
        """The next item, waiting for one on `wake` (a lock the caller holds) if none."""
        while True:
            with self._mutex:
                if self.qsize():
                    return self._take()
                self._idle.append(wake)
            # A put in between has released `wake` already: this returns at once.
            wake.acquire()

    def get_nowait(self) -> _Lane | None:
        with self._mutex:
            if self.qsize():
                return self._take()
        raise Empty

    def _take(self) -> _Lane | None:
        """The next item of a non-empty queue (under the mutex), counted for `patrol`."""
        self._taken += 1
        return self._items.popleft() if self._heap is None else heappop(self._heap)[2]

    def patrol(self) -> bool:
        """Wake one waiting worker when items were ready at _PATROL_LOOKS calls in a row
        and no worker took any meanwhile: the running workers are held up (see the class
        docstring). True when it woke one. Once awake, that worker takes the ready lanes
        one after another; if it is held up too, a later call wakes another.

        Not at the first stale look, and one worker at a time: with cheap handlers a
        running worker may just be waiting for the GIL for a few milliseconds. A first
        version woke a worker per ready lane at the first stale look, every 10 ms: on
        bench (a) it fired 15-23 times per 300,000 records, waking every idle worker
        each time, and the 1M-record run took 21.1-21.4 s against 19.0 s without it
        (medians of 3, one process). As it is, it did not fire in 4 runs of 1M."""
        with self._mutex:
            if self._taken != self._patrolled or not self.qsize():
                self._patrolled = self._taken
                self._stale_looks = 0
                return False
            self._stale_looks += 1
            if self._stale_looks < _PATROL_LOOKS or not self._idle:
                return False
            self._stale_looks = 0
            wake = self._idle.pop()
        wake.release()
        return True

    def longest_first(self) -> None:
        """From now on, the lane with the most queued events first (under the dispatcher
        lock, so that no lane's entries change meanwhile)."""
        with self._mutex:
            if self._heap is not None:
                return
            self._heap = [(_queued_first(item), i, item) for i, item in enumerate(self._items)]
            heapify(self._heap)
            self._seq = len(self._heap)
            self._items.clear()

    def qsize(self) -> int:
        return len(self._items) if self._heap is None else len(self._heap)


def _queued_first(item: _Lane | None) -> float:
    """Heap key of a ready lane: minus its queued events; a worker's stop (None) first."""
    if item is None:
        return float("-inf")
    return -sum(len(entry) for entry in item.entries if type(entry) is list)


class _Lane:
    __slots__ = ("breaker", "entries", "index", "state")

    def __init__(self, index: int) -> None:
        self.index = index
        self.entries: list[list[ChangeEvent] | _Control] = []
        self.state = _IDLE
        self.breaker: KeyBreaker | None = None  # created at the lane's first dead letter


class _Barrier:
    """One DDL's barrier over its table; mutated under the dispatcher lock."""

    __slots__ = (
        "done",
        "done_waiters",
        "fence_waiters",
        "fenced",
        "fences_left",
        "gated",
        "lane",
        "table",
    )

    def __init__(self, table: str, lane: int) -> None:
        self.table = table
        self.lane = lane  # the DDL's lane: its own order already holds later events back
        self.fences_left = 0
        self.fenced = False
        self.done = False
        self.fence_waiters: list[_Lane] = []
        self.done_waiters: list[_Lane] = []
        self.gated: set[int] = set()


class _Control:
    __slots__ = ("barrier", "kind")

    def __init__(self, kind: int, barrier: _Barrier) -> None:
        self.kind = kind
        self.barrier = barrier


def _same_table_end(batch: list[ChangeEvent], index: int, table: str) -> int:
    """Where the run of `table`'s events starting at `index` ends (BATCH_MAX_EVENTS at
    most): what one batch handler call receives."""
    end = min(len(batch), index + BATCH_MAX_EVENTS)
    for i in range(index + 1, end):
        if batch[i].table != table:
            return i
    return end


def _table_bytes(table: str) -> bytes:
    return b"table\0" + table.encode(errors="surrogatepass")


def _key_prefix(table: str) -> bytes:
    return b"key\0" + table.encode(errors="surrogatepass") + b"\0"


def _require_count(field: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"LaneDispatcher {field} must be an integer >= 1, got {value!r}")


def _require_ordering(field: str, value: object) -> None:
    if value not in ORDERING_MODES:
        raise ValueError(f"LaneDispatcher {field} must be one of {ORDERING_MODES}, got {value!r}")
