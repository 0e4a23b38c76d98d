"""DDL and truncate barriers: every earlier event of the table completes before the
barrier event runs, and every later one waits for it.

Under `table` or `partition` ordering all of a table's events share the barrier event's
lane, so lane order already is the barrier. Under `key` ordering the table is spread
over lanes: the dispatcher puts a fence in every busy lane, runs the DDL on the table's
lane once every fence is passed, and gates every lane that receives a later event of the
table until the DDL is done. A lane waiting at a gate is parked, not blocking a worker,
and every wait points at earlier submissions, so the barrier cannot deadlock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from binlog_assets.formats.event import OP_DDL, OP_TRUNCATE

if TYPE_CHECKING:
    from binlog_assets.consume.scheduling import Lane

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
