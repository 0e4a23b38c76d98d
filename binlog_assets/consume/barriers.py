"""DDL and truncate barriers: every earlier event of the table completes before the
barrier event runs, and every later one waits for it.

Under `table` or `partition` ordering all of a table's events share the barrier event's
slot, so slot order already is the barrier. Under `key` ordering the table is spread
over slots: `Barriers` puts a fence in every busy slot, queues the DDL on the table's
slot to run once every fence is passed, and gates every slot that receives a later event
of the table until the DDL is done. A slot waiting at a gate is parked, not blocking a
worker, and every wait points at earlier submissions, so the barrier cannot deadlock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from binlog_assets.consume.scheduling import IDLE, PARKED, SCHEDULED
from binlog_assets.formats.event import OP_DDL, OP_TRUNCATE, ChangeEvent

if TYPE_CHECKING:
    from binlog_assets.consume.scheduling import ReadyQueue, Slot
    from binlog_assets.consume.slot_routing import TableSlots

# A DDL and a truncate carry no key: each runs on its table's slot, after every earlier
# event of its table and before every later one, whatever slot those keys hash to.
BARRIER_OPS = frozenset({OP_DDL, OP_TRUNCATE})

# Barrier control entries, queued in slots between event batches.
FENCE = 0  # this slot has finished everything submitted before the DDL
AWAIT_FENCES = 1  # DDL slot: wait until every fence is passed
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
        "slot",
        "table",
    )

    def __init__(self, table: str, slot: int) -> None:
        self.table = table
        self.slot = slot  # the DDL's slot: its own order already holds later events back
        self.fences_left = 0
        self.fenced = False
        self.done = False
        self.fence_waiters: list[Slot] = []
        self.done_waiters: list[Slot] = []
        self.gated: set[int] = set()


class Control:
    __slots__ = ("barrier", "kind")

    def __init__(self, kind: int, barrier: Barrier) -> None:
        self.kind = kind
        self.barrier = barrier


class Barriers:
    """The barriers of one dispatcher, the latest per table in `by_table`, placed and passed
    through slot entries. Every method runs under the dispatcher lock."""

    __slots__ = ("_slots", "_ready", "by_table")

    def __init__(self, slots: list[Slot], ready: ReadyQueue) -> None:
        self.by_table: dict[str, Barrier] = {}
        self._slots = slots
        self._ready = ready

    def enqueue_in_order(self, events: Sequence[ChangeEvent],
                         tables: Mapping[str, TableSlots]) -> None:
        """Queue `events` (each table's `TableSlots` known) around the barriers: the slow path for
        batches with a key-ordered DDL or truncate, or a table behind a barrier."""
        by_table, slots, schedule = self.by_table, self._slots, self._ready.schedule
        held: dict[int, list[ChangeEvent]] = {}  # per slot, not yet appended
        for event in events:
            table = event.table
            barrier = by_table.get(table)
            if barrier is not None and barrier.done:
                del by_table[table]
                barrier = None
            choice = tables[table]
            if event.op in BARRIER_OPS and choice.fixed < 0:
                # Fences must follow everything submitted before the DDL, in every slot.
                self._schedule_all(held)
                held = {}
                self._place(event, choice.table_slot)
                continue
            slot = choice.slot(event.key, len(slots))
            if barrier is not None and slot != barrier.slot and slot not in barrier.gated:
                if slot in held:
                    schedule(slots[slot], held.pop(slot))
                schedule(slots[slot], Control(GATE, barrier))
                barrier.gated.add(slot)
            held.setdefault(slot, []).append(event)
        self._schedule_all(held)

    def _schedule_all(self, held: dict[int, list[ChangeEvent]]) -> None:
        for index, batch in held.items():
            self._ready.schedule(self._slots[index], batch)

    def _place(self, event: ChangeEvent, ddl_slot: int) -> None:
        schedule = self._ready.schedule
        barrier = Barrier(event.table, ddl_slot)
        for slot in self._slots:
            # An idle slot has finished everything submitted so far: no fence needed.
            if slot.index != ddl_slot and slot.state != IDLE:
                schedule(slot, Control(FENCE, barrier))
                barrier.fences_left += 1
        barrier.fenced = barrier.fences_left == 0
        slot = self._slots[ddl_slot]
        schedule(slot, Control(AWAIT_FENCES, barrier))
        schedule(slot, [event])
        schedule(slot, Control(RELEASE, barrier))
        self.by_table[event.table] = barrier

    def control(self, slot: Slot, entry: Control, entries: list, i: int) -> bool:
        """Apply `entry` (`entries[i]` of a run of `slot`); True when the slot was parked to
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
        # The entry itself stays first, so the slot re-checks it when woken.
        slot.entries = entries[i:] + slot.entries
        slot.state = PARKED
        waiters.append(slot)
        return True

    def _wake(self, slots: list[Slot]) -> None:
        for slot in slots:
            slot.state = SCHEDULED
            self._ready.put(slot)
        slots.clear()
