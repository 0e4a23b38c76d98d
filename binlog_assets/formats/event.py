"""The one change-event model every format decodes into, and the binlog position order.

Every decoder (Debezium, Maxwell, Canal, DTS) turns a Kafka record into zero or more
`ChangeEvent`s. Downstream code (lanes, handlers, the changelog, the replica MERGE) only
ever sees this model, so the ordering rules live here once: a `Position` compares as a
tuple of integers, never as strings; its lineage (`consume/lineage.py`) ranks a source's
binlog histories, and a snapshot read counts just below the changes streamed from the
binlog position it was read at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

# Operations a ChangeEvent can carry. `ddl` is a schema change (a barrier for its table).
OP_CREATE = "c"
OP_UPDATE = "u"
OP_DELETE = "d"
OP_READ = "r"  # snapshot read
OP_TRUNCATE = "t"
OP_DDL = "ddl"

# The first field of a position: which of the source's binlog histories it is in. A
# decoder gives FIRST_LINEAGE; the run places each event in its lineage. Lineage 0 is
# what lakes written before lineages hold for snapshot reads: below every stream.
LEGACY_SNAPSHOT_LINEAGE = 0
FIRST_LINEAGE = 1

# The `row` of what a snapshot reads at binlog position P, below every change streamed
# from P (rows 0 and up): the snapshot's end (a truncate that removes what the snapshot
# did not read), then its schema, then its rows.
SNAPSHOT_END_ROW = -3
SNAPSHOT_SCHEMA_ROW = -2
SNAPSHOT_ROW = -1
_ROW_SHIFT = -SNAPSHOT_END_ROW

_BINLOG_SUFFIX = re.compile(r"\.(\d+)$")

# A statement on a whole database has no table: its DDL event's table is `db.*`. Only
# DROP DATABASE is kept (replicas act on it); the others change no replica.
DATABASE_WIDE = "*"
_DROP_DATABASE = re.compile(
    r"^\s*DROP\s+(?:DATABASE|SCHEMA)\s+(?:IF\s+EXISTS\s+)?(`(?:[^`]|``)+`|[A-Za-z0-9_$]+)",
    re.I)


def dropped_database(ddl: str) -> str | None:
    """The database a `DROP DATABASE` statement drops, else None."""
    m = _DROP_DATABASE.match(ddl)
    if m is None:
        return None
    name = m.group(1)
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


class DecodeError(ValueError):
    """A message that cannot become ChangeEvents; the message says which field is wrong."""


class UnknownSchemaError(DecodeError):
    """A record names a schema id its registry does not know: far more often a wrong
    registry or a lost store than one bad record, so the run stops its partition at the
    record unless `dead_letter` (the config's choice once the schemas are known gone)."""

    def __init__(self, message: str, schema_id: int, registry: str, *,
                 dead_letter: bool = False) -> None:
        super().__init__(message)
        self.schema_id = schema_id
        self.registry = registry
        self.dead_letter = dead_letter


class SnapshotPending(DecodeError):
    """A snapshot's end that cannot be made yet: which tables the snapshot read is in its
    producer's schema-change topic, which has not been consumed that far. The run ends
    before the record, and the next run takes it up again."""


class SourceUnavailableError(RuntimeError):
    """Something a decoder needs besides the record (a schema registry) cannot be reached:
    no record can be decoded until it can, so the run fails rather than dead-lettering."""


class Position(NamedTuple):
    """A total order over a source's changes: compared field by field as integers.

    `lineage` numbers the source's binlog histories (a failover to a server with its own
    binlog numbering, a binlog reset, a re-snapshot each start one), `file` is the binlog
    file's numeric suffix (mysql-bin.000123 -> 123), `pos` the byte offset within it (or a
    GTID sequence number where that is all a source has), `row` the row index inside one
    binlog event (negative for what a snapshot read: SNAPSHOT_ROW and the rows above).
    Formats without any binlog coordinate use zeros and let the Kafka offset (the
    ChangeEvent's tie-breaker) decide. Stored as `pos_phase`.. in the changelog and as
    the struct `_position(phase, file, pos, row, ...)` in replicas: `phase` is the lineage.
    """

    lineage: int = FIRST_LINEAGE
    file: int = 0
    pos: int = 0
    row: int = 0

    @property
    def snapshot(self) -> bool:
        """Read by a snapshot (its rows, schema or end), not streamed from the binlog."""
        return self.row < 0 or self.lineage == LEGACY_SNAPSHOT_LINEAGE

    @property
    def coordinates(self) -> tuple[int, int, int]:
        """(file, pos, row): where in one binlog, whatever the lineage."""
        return self.file, self.pos, self.row


def binlog_file_index(name: str) -> int:
    """`mysql-bin.000123` -> 123. Raises DecodeError when the name has no numeric suffix."""
    m = _BINLOG_SUFFIX.search(name or "")
    if m is None:
        raise DecodeError(f"binlog file name {name!r} has no numeric suffix")
    return int(m.group(1))


@dataclass(slots=True)
class ChangeEvent:
    """One row change (or DDL) with its source position and Kafka coordinates.

    `key` holds the primary-key values in `key_columns` order; for a table without a
    declared key it is empty and the ordering key falls back to the table.
    `row_index` tells apart several events decoded from one Kafka record (a Canal message
    with many rows, a primary-key change split into delete + create).
    """

    table: str  # "db.table"
    op: str
    key: tuple[Any, ...]
    key_columns: tuple[str, ...]
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    position: Position
    source_ts: int | None  # milliseconds since the epoch, from the source database
    topic: str = ""
    partition: int = 0
    offset: int = -1
    row_index: int = 0
    ddl: str | None = None
    # column -> canonical type (int, bigint, decimal(p,s), string, ...); shared, read-only
    column_types: dict[str, str] | None = None
    # Where the change was made, as the producer says: the server id that wrote it to the
    # binlog and its GTID (MariaDB `domain-server-seq`, MySQL `uuid:n`); None if not said.
    server_id: int | None = None
    gtid: str | None = None

    @property
    def database(self) -> str:
        return self.table.split(".", 1)[0]

    @property
    def table_name(self) -> str:
        return self.table.split(".", 1)[1] if "." in self.table else self.table

    def sort_key(self) -> tuple[Position, int, int]:
        """Total order: position, then Kafka offset, then row within one record."""
        return (self.position, self.offset, self.row_index)

    def sort_text(self) -> str:
        """`sort_key` as fixed-width digits, so that comparing the texts (in a store that
        keeps text: Redis, a search index) orders as `sort_key` does."""
        (lineage, file, pos, row), offset, row_index = self.sort_key()
        # Snapshot rows are negative and a re-sync's offset is -1: shifted to count from 0.
        return (f"{lineage:05d}{file:010d}{pos:020d}{row + _ROW_SHIFT:08d}"
                f"{offset + 1:020d}{row_index:06d}")
