"""Re-sync a key range of a replica from its source, while streaming goes on.

binlake reads the range itself, as pt-table-sync does: inside one consistent snapshot
at binlog position P, over the read-only connection. The new rule: a re-synced chunk
counts at position P (phase 1, P's file and byte position, Kafka offset -1, so a change
streamed at P itself still ranks above it):

- its rows replace the replica's rows of the range whose `_position` is below P;
- the replica's live rows of the range that the chunk lacks, below P, become tombstones
  at P (a snapshot emits no deletes, so the re-sync makes them);
- rows the stream brought at or past P stay: later streamed changes win, and a change
  after P applied later passes the position guard as it would over any older row.

It is one delta-rs MERGE per chunk (no Spark), guarded like an apply
(`s._position > t._position`), so a re-sync that races the follower leaves whichever
is newer per key. A table without a key has no range to re-sync.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from binlog_assets.formats.mysql_types import time_text
from binlog_assets.parity.canonical import quote
from binlog_assets.parity.chunks import KeyRange, key_value, next_upper_sql, range_sql
from binlog_assets.parity.lake import LIVE_OPS, replica_uri
from binlog_assets.parity.source import BinlogPosition, Snapshot, SourceTable

if TYPE_CHECKING:
    import pyarrow as pa
    import pymysql

    from binlog_assets.config import PipelineConfig

_META = ("_source_db", "_source_table", "_op", "_position", "_source_ts", "_applied_at")
_OP_RESYNC = "r"


@dataclass
class ChunkResync:
    key_range: KeyRange
    position: BinlogPosition
    source_rows: int
    written: int  # rows inserted or replaced
    deleted: int  # replica rows the chunk lacked, now tombstones


def resync_table(pipeline: PipelineConfig, replica: str, db: pymysql.Connection,
                 table: SourceTable, key_range: KeyRange | None = None) -> list[ChunkResync]:
    """Re-sync `key_range` of `table` (None: the whole table, chunk by chunk of
    `parity.chunk_rows`, each at its own snapshot)."""
    if not table.key:
        raise ValueError(f"{table.name} has no key: its replica is a log of changes, which "
                         f"a key range cannot re-sync")
    from deltalake import DeltaTable

    uri = replica_uri(pipeline, replica)
    schema = DeltaTable(uri).schema().to_arrow()
    import pyarrow as pa

    schema = pa.schema(schema)
    key_names = _replica_names(schema, table.key)
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
        done.append(_merge(uri, schema, table, key_names, chunk, rows, position))
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


def _merge(uri: str, schema: pa.Schema, table: SourceTable, key_names: list[str],
           chunk: KeyRange, rows: list[dict[str, Any]], position: BinlogPosition
           ) -> ChunkResync:
    import pyarrow as pa
    from deltalake import DeltaTable

    now = datetime.now(UTC)
    at = {"phase": 1, "file": position.file, "pos": position.pos, "row": 0, "offset": -1,
          "row_index": 0}
    source_keys = {tuple(key_value(r[k]) for k in table.key) for r in rows}
    batch: dict[str, list[Any]] = {n: [] for n in schema.names}
    by_lower = {k.lower(): k for k in (rows[0] if rows else {})}
    for row in rows:
        for name in schema.names:
            if name in _META:
                value = {"_source_db": table.database, "_source_table": table.table,
                         "_op": _OP_RESYNC, "_position": at, "_source_ts": None,
                         "_applied_at": now}[name]
            else:
                source = by_lower.get(name.lower())
                value = None if source is None else _typed(row[source],
                                                           schema.field(name).type)
            batch[name].append(value)
    deleted = 0
    for old in _live_rows(uri, table, key_names, chunk):
        if tuple(key_value(old[k]) for k in key_names) in source_keys:
            continue
        deleted += 1
        for name in schema.names:
            batch[name].append({"_op": "d", "_position": at, "_applied_at": now}.get(
                name, old.get(name)))
    arrays = pa.table({n: pa.array(batch[n], type=schema.field(n).type)
                       for n in schema.names}, schema=schema)
    match = " AND ".join(f"t.{_q(k)} = s.{_q(k)}"
                         for k in [*key_names, "_source_db", "_source_table"])
    assign = {_q(n): f"s.{_q(n)}" for n in schema.names}
    metrics = (DeltaTable(uri).merge(arrays, match, source_alias="s", target_alias="t")
               .when_matched_update(assign, predicate="s._position > t._position")
               .when_not_matched_insert(assign, predicate=f"s._op = '{_OP_RESYNC}'")
               .execute())
    written = int(metrics.get("num_target_rows_inserted", 0)
                  + metrics.get("num_target_rows_updated", 0))
    return ChunkResync(chunk, position, len(rows), written - deleted, deleted)


def _live_rows(uri: str, table: SourceTable, key_names: list[str], chunk: KeyRange
               ) -> list[dict[str, Any]]:
    """The replica's live rows of `table` in `chunk`, as Python dicts."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    reader = QueryBuilder().register("replica", DeltaTable(uri)).execute(
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


def _typed(value: Any, arrow_type: pa.DataType) -> Any:
    """A source value (as PyMySQL reads it, the session in UTC) as the replica holds it."""
    import pyarrow as pa

    if value is None:
        return None
    if isinstance(value, timedelta):
        return time_text(value // timedelta(microseconds=1))  # TIME: text, as replicas do
    if pa.types.is_timestamp(arrow_type) and isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value
    if pa.types.is_decimal(arrow_type) and isinstance(value, int):
        return Decimal(value)
    if pa.types.is_boolean(arrow_type):
        return bool(value)
    if (pa.types.is_string(arrow_type) or pa.types.is_string_view(arrow_type)) and \
            not isinstance(value, str):
        return value.decode() if isinstance(value, bytes) else str(value)
    return value


def _q(name: str) -> str:
    return quote(name)


def _escaped(text: str) -> str:
    return text.replace("'", "''")
