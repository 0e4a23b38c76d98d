"""Re-sync a key range of a replica from its source, while streaming goes on.

binlake reads the range itself, as pt-table-sync does: inside one consistent snapshot
at binlog position P, over the read-only connection, and appends the range to the
changelog as change events at P (P's lineage, file and byte position, Kafka offset -1,
so a change streamed at P itself still ranks above them: `parity/lineage.py` places P);
the replica's apply brings them in like any change, and the changelog stays the whole
truth of the replica:

- each source row of the range is an `r` event with its row as the after image: it
  replaces the replica's row of that key where the row's `_position` is below P;
- each live replica row of the range the source lacks is a `d` event with the row as
  its before image (a snapshot emits no deletes, so the re-sync makes them);
- rows the stream brought at or past P stay: later streamed changes win, and a change
  after P applied later passes the position guard as it would over any older row.

A table without a key, or a replica kept as a log of changes, has no range to re-sync.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from binlog_assets.formats.event import FIRST_LINEAGE, OP_DELETE, OP_READ, ChangeEvent, Position
from binlog_assets.formats.mysql_types import time_text
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.lakehouse.replica.routes import replica_route
from binlog_assets.parity.chunks import KeyRange, key_value, next_upper_sql, range_sql
from binlog_assets.parity.lake import LIVE_OPS, replica_uri
from binlog_assets.parity.source import BinlogPosition, Snapshot, SourceTable

if TYPE_CHECKING:
    import pyarrow as pa
    import pymysql

    from binlog_assets.config import PipelineConfig

_META = ("_source_db", "_source_table", "_op", "_position", "_source_ts", "_applied_at")


@dataclass(frozen=True)
class ReplicaSide:
    """The replica a re-sync reads its live rows from: its location, its Arrow schema,
    and the source table's key as the replica names its columns."""

    uri: str
    schema: pa.Schema
    key_names: list[str]


@dataclass
class ChunkResync:
    key_range: KeyRange
    position: BinlogPosition
    source_rows: int  # `r` events written
    deleted: int  # `d` events written: live replica rows the chunk lacked
    version: int  # the changelog commit that holds them


def resync_table(pipeline: PipelineConfig, replica: str, db: pymysql.Connection,
                 table: SourceTable, key_range: KeyRange | None = None,
                 lineage: Callable[[BinlogPosition], int] = lambda position: FIRST_LINEAGE
                 ) -> list[ChunkResync]:
    """Re-sync `key_range` of `table` (None: the whole table, chunk by chunk of
    `parity.chunk_rows`, each at its own snapshot): one changelog commit per chunk.
    `lineage` places a snapshot's position in the source's lineages (raising when it has
    no place yet)."""
    if not table.key:
        raise ValueError(f"{table.name} has no key: its replica is a log of changes, which "
                         f"a key range cannot re-sync")
    if replica_route(pipeline, replica).replica_mode == "append":
        raise ValueError(f"replica {replica!r} keeps every change (replica_mode: append): "
                         f"a key range cannot re-sync a log of changes")
    import pyarrow as pa
    from deltalake import DeltaTable

    uri = replica_uri(pipeline, replica)
    schema = pa.schema(DeltaTable(uri).schema().to_arrow())
    side = ReplicaSide(uri, schema, _replica_names(schema, table.key))
    writer = ChangelogWriter(pipeline)
    done = []
    lower = None if key_range is None else key_range.lower
    while True:
        with Snapshot(db) as position:
            if key_range is not None:
                chunk = key_range
            elif not table.ranged:
                chunk = KeyRange(None, None)
            else:
                sql, params = next_upper_sql(table.sql_name, table.key, lower,
                                             pipeline.parity.chunk_rows)
                with db.cursor() as cur:
                    cur.execute(sql, params)
                    found = cur.fetchone()
                chunk = KeyRange(lower, None if found is None else
                                 tuple(key_value(v) for v in found))
            rows = _source_rows(db, table, chunk)
        events, deleted = _events(table, chunk, rows, position, lineage(position),
                                  replica=side)
        version = writer.append(events, f"resync/{replica}/{table.name}@{position.name}:"
                                        f"{position.pos}")
        done.append(ChunkResync(chunk, position, len(rows), deleted, version))
        if key_range is not None or chunk.upper is None:
            return done
        lower = chunk.upper


def _source_rows(db: pymysql.Connection, table: SourceTable, chunk: KeyRange
                 ) -> list[dict[str, Any]]:
    where, params = range_sql(table.key, chunk)
    with db.cursor() as cur:
        cur.execute(f"SELECT * FROM {table.sql_name} WHERE {where}", params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _replica_names(schema: pa.Schema, columns: tuple[str, ...]) -> list[str]:
    present = {n.lower(): n for n in schema.names}
    missing = [c for c in columns if c.lower() not in present]
    if missing:
        raise ValueError(f"the replica has no column {missing}")
    return [present[c.lower()] for c in columns]


def _events(table: SourceTable, chunk: KeyRange, rows: list[dict[str, Any]],
            position: BinlogPosition, lineage: int = FIRST_LINEAGE, *,
            replica: ReplicaSide) -> tuple[list[ChangeEvent], int]:
    """The chunk's change events at `position` of `lineage`, and how many of them are
    deletes."""
    at = Position(lineage, position.file, position.pos)
    schema = replica.schema
    types = {n.lower(): schema.field(n).type for n in schema.names if n not in _META}
    # The replica's types, declared per image's spelling of its columns (one map for a
    # chunk's reads, one for its deletes), so nothing is typed by inference.
    declared_for: dict[tuple[str, ...], dict[str, str]] = {}

    def event(op: str, image: dict[str, Any]) -> ChangeEvent:
        names = tuple(image)
        declared = declared_for.get(names)
        if declared is None:
            declared = declared_for[names] = {
                n: t for n, t in ((n, canonical_type(types[n.lower()]))
                                  for n in names if n.lower() in types) if t is not None}
        key = tuple(image[k] for k in table.primary)
        return ChangeEvent(
            table=table.name, op=op, key=key, key_columns=table.primary,
            before=image if op == OP_DELETE else None,
            after=None if op == OP_DELETE else image, position=at, source_ts=None,
            partition=-1, offset=-1, row_index=len(events), column_types=declared or None)

    events: list[ChangeEvent] = []
    source_keys = set()
    for row in rows:
        image = {n: event_value(v, types.get(n.lower())) for n, v in row.items()}
        source_keys.add(tuple(key_value(row[k]) for k in table.key))
        events.append(event(OP_READ, image))
    deleted = 0
    for old in _live_rows(table, chunk, replica=replica):
        if tuple(key_value(old[k]) for k in replica.key_names) in source_keys:
            continue
        deleted += 1
        spelled = {n.lower(): n for n in old}
        image = {n: event_value(v, types.get(n.lower())) for n, v in old.items()
                 if n not in _META}
        for k in table.primary:  # the key as the source spells it, as a stream's events do
            image[k] = image.pop(spelled[k.lower()])
        events.append(event(OP_DELETE, image))
    return events, deleted


def _live_rows(table: SourceTable, chunk: KeyRange, *, replica: ReplicaSide
               ) -> list[dict[str, Any]]:
    """The replica's live rows of `table` in `chunk`, as Python dicts."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    key_names = replica.key_names
    reader = QueryBuilder().register("replica", DeltaTable(replica.uri)).execute(
        f"SELECT * FROM replica WHERE _op IN ({', '.join(repr(o) for o in LIVE_OPS)}) "
        f"AND _source_db = '{_escaped(table.database)}' "
        f"AND _source_table = '{_escaped(table.table)}'")
    rows = pa.table(reader.read_all()).to_pylist()
    keyed = sorted(((tuple(key_value(r[k]) for k in key_names), r) for r in rows),
                   key=lambda kr: kr[0])
    keys = [k for k, _ in keyed]
    first = 0 if chunk.lower is None else bisect.bisect_right(keys, chunk.lower)
    last = len(keys) if chunk.upper is None else bisect.bisect_right(keys, chunk.upper)
    return [r for _, r in keyed[first:last]]


def event_value(value: Any, arrow_type: pa.DataType | None) -> Any:
    """A value read from the source (PyMySQL, the session in UTC) or from the replica
    (Arrow), as a decoded change event holds it for a replica column of `arrow_type`:
    times of day as text, timestamps naive in UTC, decimals exact, text as str."""
    import pyarrow as pa

    if value is None:
        return None
    if isinstance(value, timedelta):
        return time_text(value // timedelta(microseconds=1))  # TIME: text, as replicas do
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    if arrow_type is None:
        return value
    if pa.types.is_decimal(arrow_type) and isinstance(value, int):
        return Decimal(value)
    if pa.types.is_boolean(arrow_type):
        return bool(value)
    if (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
            or pa.types.is_string_view(arrow_type)) and not isinstance(value, str):
        if isinstance(value, set):  # a SET column: its members, as the source lists them
            return ",".join(sorted(value))
        return value.decode() if isinstance(value, bytes) else str(value)
    return value


def canonical_type(arrow_type: pa.DataType) -> str | None:
    """The canonical type name (`formats/mysql_types.py`) of a replica column's Arrow
    type: what the re-sync's events declare, so the apply types them as the replica holds
    them. None: left to the value."""
    import pyarrow as pa

    if pa.types.is_integer(arrow_type):
        return "bigint" if arrow_type.bit_width == 64 else "int"
    if pa.types.is_decimal(arrow_type):
        return f"decimal({arrow_type.precision},{arrow_type.scale})"
    checks = ((pa.types.is_float32, "float"), (pa.types.is_float64, "double"),
              (pa.types.is_boolean, "boolean"), (pa.types.is_date, "date"),
              (pa.types.is_timestamp, "timestamp"), (pa.types.is_string, "string"),
              (pa.types.is_large_string, "string"), (pa.types.is_string_view, "string"),
              (pa.types.is_binary, "binary"), (pa.types.is_large_binary, "binary"))
    return next((name for check, name in checks if check(arrow_type)), None)


def _escaped(text: str) -> str:
    return text.replace("'", "''")
