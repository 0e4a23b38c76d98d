"""Which slot a worker runs next: the ready queue, its wake-up rule, and the slots.

Slots are many and cheap; a pool of worker threads runs them, a slot on at most one
worker at a time, so a slot is serial (what keeps a key's events in order). The ready
queue hands slots to workers first in, first out (the oldest events hold the commit
point back), wakes a waiting worker for each ready slot only while handlers wait on I/O,
and lets a patrol wake one when ready slots stay untaken. Figures behind these rules:
bench/RESULTS.md, "P2 slow handlers" and "P1 pipeline throughput".
"""

from __future__ import annotations

import threading
from collections import deque
from heapq import heapify, heappop, heappush
from queue import Empty
from typing import TYPE_CHECKING

from binlog_assets.consume.errors import KeyBreaker

if TYPE_CHECKING:
    from binlog_assets.consume.barriers import Control
    from binlog_assets.formats.event import ChangeEvent

# Handlers taking at least this long per event (a moving average) get a waiting worker
# woken for every slot that becomes ready; cheaper ones only when no worker is running or
# the ready slots pile up past _LAZY_BACKLOG (see `ReadyQueue`).
EAGER_EVENT_SECONDS = 0.0001
_LAZY_BACKLOG = 256
# How often the patrol looks for ready slots that no worker took, and after how many
# looks in a row it wakes a worker for them (see `ReadyQueue`).
PATROL_SECONDS = 0.02
_PATROL_LOOKS = 2

# Slot states, changed only under the dispatcher lock.
IDLE = 0  # no entries, not on the ready queue, no worker on it
SCHEDULED = 1  # on the ready queue or being run by a worker
PARKED = 2  # waiting for a barrier; the barrier puts it back on the ready queue


class ReadyQueue:
    """Slots ready to run, and the workers waiting for one.

    Each waiting worker blocks on a lock of its own, so a `put` wakes exactly one (a
    shared lock woke one worker per burst). `eager` (handlers that wait on I/O) wakes a
    worker for every ready slot; with cheap handlers only when none is running, the
    backlog passes _LAZY_BACKLOG, or `patrol()` finds ready slots left untaken, since
    extra threads then only compete with the poll thread for the GIL. Slots come out
    first in, first out (the oldest events hold the commit point back), and after
    `longest_first()` the slot with the most queued events first (a shorter drain).
    """

    __slots__ = ("_event_seconds", "_heap", "_idle", "_items", "_mutex", "_patrolled", "_seq",
                 "_stale_looks", "_taken", "_workers", "eager")

    def __init__(self, workers: int) -> None:
        self._mutex = threading.Lock()
        self._items: deque[Slot | None] = deque()
        self._heap: list[tuple[float, int, Slot | None]] | None = None  # longest first
        self._seq = 0
        self._idle: list[threading.Lock] = []  # wake locks of waiting workers, all held
        self._workers = workers
        self._taken = 0  # items taken by workers so far
        self._patrolled = 0  # _taken at the last patrol
        self._stale_looks = 0  # patrols in a row that found ready items and no take
        self.eager = True  # until the handlers are measured
        self._event_seconds: float | None = None  # moving average, from the first sample

    def put(self, item: Slot | None) -> None:
        """Queue `item`; callers that change slots hold the dispatcher lock."""
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

    def schedule(self, slot: Slot, entry: list[ChangeEvent] | Control) -> None:
        """Queue `entry` in `slot`, and put the slot on the queue if it was idle (under the
        dispatcher lock)."""
        entries = slot.entries
        if type(entry) is list and entries and type(entries[-1]) is list:
            # Fewer, longer batches: the worker's per-batch cost is paid once.
            entries[-1].extend(entry)
        else:
            entries.append(entry)
        if slot.state == IDLE:
            slot.state = SCHEDULED
            self.put(slot)

    def measured(self, seconds: float) -> None:
        """A slot run took `seconds` per event: `eager` follows their moving average.
        Unlocked on purpose: a lost update between workers only delays it by one sample."""
        average = self._event_seconds
        average = seconds if average is None else average + 0.2 * (seconds - average)
        self._event_seconds = average
        self.eager = average >= EAGER_EVENT_SECONDS

    def get(self, wake: threading.Lock) -> Slot | None:
        """The next item, waiting for one on `wake` (a lock the caller holds) if none."""
        while True:
            with self._mutex:
                if self.qsize():
                    return self._take()
                self._idle.append(wake)
            # A put in between has released `wake` already: this returns at once.
            wake.acquire()

    def get_nowait(self) -> Slot | None:
        with self._mutex:
            if self.qsize():
                return self._take()
        raise Empty

    def _take(self) -> Slot | None:
        """The next item of a non-empty queue (under the mutex), counted for `patrol`."""
        self._taken += 1
        return self._items.popleft() if self._heap is None else heappop(self._heap)[2]

    def patrol(self) -> bool:
        """Wake one waiting worker when items were ready at _PATROL_LOOKS calls in a row
        and no worker took any meanwhile (the running ones are held up in a handler).
        True when it woke one. One worker per look, and not at the first stale look:
        a running worker may only be waiting for the GIL."""
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
        """From now on, the slot with the most queued events first (under the dispatcher
        lock, so that no slot's entries change meanwhile)."""
        with self._mutex:
            if self._heap is not None:
                return
            self._heap = [(_queued_first(item), i, item) for i, item in enumerate(self._items)]
            heapify(self._heap)
            self._seq = len(self._heap)
            self._items.clear()

    def qsize(self) -> int:
        return len(self._items) if self._heap is None else len(self._heap)


def _queued_first(item: Slot | None) -> float:
    """Heap key of a ready slot: minus its queued events; a worker's stop (None) first."""
    if item is None:
        return float("-inf")
    return -sum(len(entry) for entry in item.entries if type(entry) is list)


class Slot:
    __slots__ = ("breaker", "entries", "index", "state")

    def __init__(self, index: int) -> None:
        self.index = index
        self.entries: list[list[ChangeEvent] | Control] = []
        self.state = IDLE
        self.breaker: KeyBreaker | None = None  # created at the slot's first dead letter
