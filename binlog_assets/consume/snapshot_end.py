"""The end of a snapshot for the tables it found empty.

A snapshot's last row of each table is followed by that table's snapshot end (a
truncate just below the snapshot's rows: `formats/base.snapshot_end`), which removes what
the snapshot did not read. A table the snapshot found empty has no row, so nothing ends
it, and rows deleted from it while no snapshot ran would stay. The snapshot's schema
names every table it read (Debezium writes a CREATE TABLE of each to its schema-change
topic at the snapshot's position), so when the snapshot's last record arrives, every
table of that schema gets its end too: again for a table that had rows (the same
truncate at the same position changes nothing), and at last for an empty one.

The schema is in another topic, consumed apart: when the changelog does not hold it yet
and that topic has records not consumed, the run stops before the record
(`SnapshotPending`) and the next one takes it up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from binlog_assets.formats.event import (
    OP_TRUNCATE,
    SNAPSHOT_END_ROW,
    ChangeEvent,
    Position,
    SnapshotPending,
)

# (the snapshot's position, its schema-change topic) -> the tables its schema names; None
# while that topic's records up to it are not in the changelog yet.
CoveredTables = Callable[[Position, str], list[str] | None]


def nothing_covered(position: Position, schema_topic: str) -> list[str]:
    """For runs without a changelog: no schema to read the snapshot's tables from."""
    del position, schema_topic
    return []


def snapshot_ends(events: Sequence[ChangeEvent], ended: Sequence[tuple[Position, str]],
                  covered: CoveredTables) -> list[ChangeEvent]:
    """`events` of one record, and after them the end of every table each snapshot in
    `ended` read; raises SnapshotPending when a snapshot's tables are not known yet."""
    out = list(events)
    last = events[-1]
    for position, schema_topic in ended:
        tables = covered(position._replace(lineage=last.position.lineage), schema_topic)
        if tables is None:
            raise SnapshotPending(
                f"the snapshot at binlog {position.file:06d}:{position.pos} ended at "
                f"{last.topic}[{last.partition}]@{last.offset}, and which tables it read "
                f"is in schema-change topic {schema_topic!r}, not consumed that far yet")
        at = last.position._replace(row=SNAPSHOT_END_ROW)
        for table in sorted(tables):
            out.append(ChangeEvent(table, OP_TRUNCATE, (), (), None, None, at,
                                   last.source_ts, last.topic, last.partition, last.offset,
                                   out[-1].row_index + 1))
    return out
