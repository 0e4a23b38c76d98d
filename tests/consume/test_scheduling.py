"""The ready queue: one worker woken per ready slot while handlers wait, first in first
out then longest first, and the patrol that wakes a worker for slots nobody took."""

from __future__ import annotations

import threading
import time
from queue import Empty

import pytest

from binlog_assets.consume import scheduling
from binlog_assets.consume.scheduling import ReadyQueue, Slot
from binlog_assets.formats.event import ChangeEvent, Position


def event(offset: int, key: tuple = (1,)) -> ChangeEvent:
    return ChangeEvent(table="db.t", op="u", key=key, key_columns=("id",), before=None,
                       after={"id": key}, position=Position(1, 7, offset, 0), source_ts=None,
                       topic="binlog", partition=0, offset=offset)


def test_a_burst_of_ready_lanes_wakes_every_waiting_worker_while_the_poll_thread_is_busy() -> None:
    """Each put wakes one waiting worker of its own. `queue.SimpleQueue` woke one worker
    for a burst of puts and left the others asleep while the putting thread kept the GIL
    busy (decoding, in a run): with 64 workers, 63 of them started 40 ms late."""
    ready = ReadyQueue(8)
    got: list[object] = []
    started = threading.Barrier(9)

    def worker() -> None:
        wake = threading.Lock()
        wake.acquire()
        started.wait()
        got.append(ready.get(wake))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(8)]
    for thread in threads:
        thread.start()
    started.wait()
    deadline = time.monotonic() + 5
    while len(ready._idle) < 8 and time.monotonic() < deadline:
        time.sleep(0.001)  # until every worker waits
    assert len(ready._idle) == 8
    items = [Slot(i) for i in range(8)]
    for item in items:
        ready.put(item)
    # Every put released a waiting worker of its own; none is left waiting for a put.
    assert ready._idle == []
    # Busy on the GIL, as a poll thread decoding the next batch is, until all are taken.
    deadline = time.monotonic() + 5
    while len(got) < 8 and time.monotonic() < deadline:
        sum(range(200))
    assert sorted(slot.index for slot in got) == list(range(8)), len(got)
    with pytest.raises(Empty):
        ready.get_nowait()


def test_ready_lanes_come_first_in_first_out_then_longest_first_when_finishing() -> None:
    ready = ReadyQueue(1)
    slots = []
    for index, queued in enumerate([1, 5, 3, 2]):
        slot = Slot(index)
        slot.entries = [[event(index * 10 + i, key=(index,)) for i in range(queued)]]
        slots.append(slot)
    for slot in slots[:2]:
        ready.put(slot)
    assert ready.get_nowait() is slots[0]  # first in, first out before finishing
    for slot in slots[2:]:
        ready.put(slot)
    ready.longest_first()
    ready.put(slots[0])
    assert ready.qsize() == 4
    # Queued events, not arrival: 5, 3, 2, then the slot put back after the switch (1).
    assert [ready.get_nowait().index for _ in range(4)] == [1, 2, 3, 0]
    ready.put(slots[1])
    ready.put(None)  # a worker's stop goes first
    assert ready.get_nowait() is None


def test_with_cheap_handlers_a_ready_lane_wakes_a_worker_only_when_none_is_running() -> None:
    """Not eager (cheap handlers measured): the running worker takes the next slot
    itself, and waking more only makes them compete with the poll thread for the GIL.
    A stop always wakes a worker."""
    ready = ReadyQueue(4)
    ready.eager = False
    took: list[object] = []
    hold = threading.Event()

    def worker() -> None:
        wake = threading.Lock()
        wake.acquire()
        took.append(ready.get(wake))
        hold.wait(10)  # stays a running worker

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while len(ready._idle) < 4 and time.monotonic() < deadline:
        time.sleep(0.001)
    first, second = Slot(0), Slot(1)
    ready.put(first)  # no worker running: one is woken
    ready.put(second)  # one is running: nobody else
    while not took and time.monotonic() < deadline:
        time.sleep(0.001)
    assert took == [first]
    assert len(ready._idle) == 3 and ready.qsize() == 1
    ready.eager = True
    ready.put(Slot(2))  # eager: a waiting worker for this one
    assert len(ready._idle) == 2
    ready.eager = False
    ready.put(None)  # a stop wakes one whatever the mode
    assert len(ready._idle) == 1
    hold.set()


def test_patrol_wakes_one_idle_worker_for_lanes_no_worker_took_in_two_looks() -> None:
    ready = ReadyQueue(3)
    ready.eager = False
    idle = [threading.Lock() for _ in range(3)]
    for wake in idle:
        wake.acquire()
        ready._idle.append(wake)  # three workers waiting
    ready.put(Slot(0))  # none running: wakes one, which takes it
    assert ready.get_nowait().index == 0
    ready.put(Slot(1))  # one running: wakes nobody
    ready.put(Slot(2))
    assert len(ready._idle) == 2 and ready.qsize() == 2
    assert scheduling._PATROL_LOOKS == 2
    assert not ready.patrol()  # a worker took a slot since the last look
    assert ready.get_nowait().index == 1
    assert not ready.patrol()  # and again
    assert not ready.patrol()  # nobody took one since: a first stale look
    assert ready.patrol()  # the second in a row: one worker is woken
    assert len(ready._idle) == 1 and ready.qsize() == 1
    assert not ready.patrol()  # the count starts again
    assert ready.patrol()  # still not taken: the last waiting worker
    assert ready._idle == [] and not ready.patrol() and not ready.patrol()
    assert sum(not wake.locked() for wake in idle) == 3  # every wake lock was released
