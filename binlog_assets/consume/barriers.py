"""DDL and truncate barriers: every earlier event of the table completes before the
barrier event runs, and every later one waits for it.

Under `table` or `partition` ordering all of a table's events share the barrier event's
lane, so lane order already is the barrier. Under `key` ordering the table is spread
over lanes: `Barriers` puts a fence in every busy lane, queues the DDL on the table's
lane to run once every fence is passed, and gates every lane that receives a later event
of the table until the DDL is done. A lane waiting at a gate is parked, not blocking a
worker, and every wait points at earlier submissions, so the barrier cannot deadlock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from binlog_assets.consume.scheduling import IDLE, PARKED, SCHEDULED
from binlog_assets.formats.event import OP_DDL, OP_TRUNCATE, ChangeEvent

if TYPE_CHECKING:
    from binlog_assets.consume.lane_routing import TableLanes
    from binlog_assets.consume.scheduling import Lane, ReadyQueue

# A DDL and a truncate carry no key: each runs on its table's lane, after every earlier
# event of its table and before every later one, whatever lane those keys hash to.
BARRIER_OPS = frozenset({OP_DDL, OP_TRUNCATE})

# Barrier control entries, queued in lanes between event batches.
FENCE = 0  # this lane has finished everything submitted before the DDL
AWAIT_FENCES = 1  # DDL lane: wait until every fence is passed
GATE = 2  # wait until the DDL is done
RELEASE = 3  # the DDL is done


class Barrier:
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
        self.fence_waiters: list[Lane] = []
        self.done_waiters: list[Lane] = []
        self.gated: set[int] = set()


class Control:
    __slots__ = ("barrier", "kind")

    def __init__(self, kind: int, barrier: Barrier) -> None:
        self.kind = kind
        self.barrier = barrier


class Barriers:
    """The barriers of one dispatcher, the latest per table in `by_table`, placed and passed
    through lane entries. Every method runs under the dispatcher lock."""

    __slots__ = ("_lanes", "_ready", "by_table")

    def __init__(self, lanes: list[Lane], ready: ReadyQueue) -> None:
        self.by_table: dict[str, Barrier] = {}
        self._lanes = lanes
        self._ready = ready

    def enqueue_in_order(self, events: Sequence[ChangeEvent],
                         tables: Mapping[str, TableLanes]) -> None:
        """Queue `events` (each table's `TableLanes` known) around the barriers: the slow path for
        batches with a key-ordered DDL or truncate, or a table behind a barrier."""
        by_table, lanes, schedule = self.by_table, self._lanes, self._ready.schedule
        held: dict[int, list[ChangeEvent]] = {}  # per lane, not yet appended
        for event in events:
            table = event.table
            barrier = by_table.get(table)
            if barrier is not None and barrier.done:
                del by_table[table]
                barrier = None
            choice = tables[table]
            if event.op in BARRIER_OPS and choice.fixed < 0:
                # Fences must follow everything submitted before the DDL, in every lane.
                self._schedule_all(held)
                held = {}
                self._place(event, choice.table_lane)
                continue
            lane = choice.lane(event.key, len(lanes))
            if barrier is not None and lane != barrier.lane and lane not in barrier.gated:
                if lane in held:
                    schedule(lanes[lane], held.pop(lane))
                schedule(lanes[lane], Control(GATE, barrier))
                barrier.gated.add(lane)
            held.setdefault(lane, []).append(event)
        self._schedule_all(held)

    def _schedule_all(self, held: dict[int, list[ChangeEvent]]) -> None:
        for index, batch in held.items():
            self._ready.schedule(self._lanes[index], batch)

    def _place(self, event: ChangeEvent, ddl_lane: int) -> None:
        schedule = self._ready.schedule
        barrier = Barrier(event.table, ddl_lane)
        for lane in self._lanes:
            # An idle lane has finished everything submitted so far: no fence needed.
            if lane.index != ddl_lane and lane.state != IDLE:
                schedule(lane, Control(FENCE, barrier))
                barrier.fences_left += 1
        barrier.fenced = barrier.fences_left == 0
        lane = self._lanes[ddl_lane]
        schedule(lane, Control(AWAIT_FENCES, barrier))
        schedule(lane, [event])
        schedule(lane, Control(RELEASE, barrier))
        self.by_table[event.table] = barrier

    def control(self, lane: Lane, entry: Control, entries: list, i: int) -> bool:
        """Apply `entry` (`entries[i]` of a run of `lane`); True when the lane was parked to
        wait for the barrier, its entries from `i` on back in its queue."""
        barrier = entry.barrier
        if entry.kind == FENCE:
            barrier.fences_left -= 1
            if barrier.fences_left == 0:
                barrier.fenced = True
                self._wake(barrier.fence_waiters)
            return False
        if entry.kind == RELEASE:
            barrier.done = True
            self._wake(barrier.done_waiters)
            return False
        if entry.kind == AWAIT_FENCES:
            ready, waiters = barrier.fenced, barrier.fence_waiters
        else:
            ready, waiters = barrier.done, barrier.done_waiters
        if ready:
            return False
        # The entry itself stays first, so the lane re-checks it when woken.
        lane.entries = entries[i:] + lane.entries
        lane.state = PARKED
        waiters.append(lane)
        return True

    def _wake(self, lanes: list[Lane]) -> None:
        for lane in lanes:
            lane.state = SCHEDULED
            self._ready.put(lane)
        lanes.clear()
