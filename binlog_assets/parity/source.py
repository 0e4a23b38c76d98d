"""The source side of the parity check: a read-only MariaDB/MySQL connection, the tables
a replica reads, and each chunk's checksum taken by the server inside a consistent
snapshot together with the binlog position of that snapshot.

Each chunk is its own short transaction (`START TRANSACTION WITH CONSISTENT SNAPSHOT`,
the chunk's upper bound, its aggregate, COMMIT): no table lock, no long transaction,
and the position `binlog_snapshot_file`/`binlog_snapshot_position` says exactly which
binlog changes the chunk's rows include.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from binlog_assets.parity.canonical import chunk_sql, quote, row_crc_sql, source_expression
from binlog_assets.parity.chunks import (
    Key,
    KeyRange,
    key_value,
    next_upper_sql,
    orders_alike,
    range_sql,
)

if TYPE_CHECKING:
    import pymysql

    from binlog_assets.config.parity import SourceConnection
    from binlog_assets.lakehouse.replica.routes import ReplicaRoute

_BINLOG_INDEX = re.compile(r"\.(\d+)$")
_SYSTEM_DATABASES = ("mysql", "information_schema", "performance_schema", "sys")


@dataclass(frozen=True, order=True)
class BinlogPosition:
    """A binlog position compared as numbers: (file index, byte position); when read in a
    snapshot, also the time it was read at (ms)."""

    file: int
    pos: int
    name: str = ""
    taken_ms: int | None = field(default=None, compare=False)

    @classmethod
    def parse(cls, name: str, pos: int | str, taken_ms: int | None = None) -> BinlogPosition:
        m = _BINLOG_INDEX.search(name)
        if m is None:
            raise ValueError(f"binlog file name {name!r} has no numeric suffix")
        return cls(int(m.group(1)), int(pos), name, taken_ms)


@dataclass(frozen=True)
class SourceTable:
    """One source table a replica reads: its compared columns (name, DATA_TYPE), its key,
    whether the key may be chunked by ranges, the columns left out, and its primary key
    (what its change events carry as their key, whatever the replica is keyed by)."""

    database: str
    table: str
    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...]
    ranged: bool
    skipped: tuple[str, ...]
    primary: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.database}.{self.table}"

    @property
    def sql_name(self) -> str:
        return f"{quote(self.database)}.{quote(self.table)}"


@dataclass(frozen=True)
class ChunkChecksum:
    """A chunk's source fingerprint and the snapshot position it was taken at."""

    key_range: KeyRange
    rows: int
    total: int
    xor: int
    position: BinlogPosition


def connect(conn: SourceConnection) -> pymysql.Connection:
    """A read-only session in UTC, so TIMESTAMP values read as the replica holds them."""
    import pymysql

    ssl = None
    if conn.tls is not None and conn.tls.mode != "disabled":
        ssl = {"ca": conn.tls.ca, "cert": conn.tls.cert, "key": conn.tls.key,
               "check_hostname": conn.tls.mode == "verify_identity"}
        ssl = {k: v for k, v in ssl.items() if v is not None}
        if conn.tls.mode == "required":
            ssl["verify_mode"] = False
    db = pymysql.connect(host=conn.host, port=conn.port, user=conn.user,
                         password=conn.password, autocommit=True, charset="utf8mb4",
                         connect_timeout=conn.connect_timeout_seconds,
                         ssl=ssl or None, ssl_disabled=ssl is None or None)
    with db.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+00:00'")
        cur.execute("SET SESSION TRANSACTION READ ONLY")
    return db


def source_tables(db: pymysql.Connection, route: ReplicaRoute) -> list[SourceTable]:
    """The tables `route` reads (an exact name or its regex over every database), each with
    its columns and the key the replica is keyed by (key_columns, else the primary key)."""
    with db.cursor() as cur:
        cur.execute("SELECT table_schema, table_name FROM information_schema.tables WHERE "
                    "table_type = 'BASE TABLE' AND table_schema NOT IN %s",
                    (_SYSTEM_DATABASES,))
        names = sorted(f"{s}.{t}" for s, t in cur.fetchall())
    return [_describe(db, name, route.key_columns) for name in route.select(names)]


def _describe(db: pymysql.Connection, name: str, key_columns: Sequence[str] | None
              ) -> SourceTable:
    database, table = name.split(".", 1)
    with db.cursor() as cur:
        cur.execute("SELECT column_name, data_type, collation_name, column_key FROM "
                    "information_schema.columns WHERE table_schema = %s AND table_name = %s "
                    "ORDER BY ordinal_position", (database, table))
        described = cur.fetchall()
        cur.execute("SELECT column_name FROM information_schema.statistics WHERE "
                    "table_schema = %s AND table_name = %s AND index_name = 'PRIMARY' "
                    "ORDER BY seq_in_index", (database, table))
        primary = tuple(r[0] for r in cur.fetchall())
        cur.execute("SELECT index_name, column_name FROM information_schema.statistics "
                    "WHERE table_schema = %s AND table_name = %s ORDER BY index_name, "
                    "seq_in_index", (database, table))
        indexes: dict[str, list[str]] = {}
        for index, column in cur.fetchall():
            indexes.setdefault(index, []).append(column)
    kinds = {c.lower(): (c, k, coll) for c, k, coll, _ in described}
    columns = tuple((c, k) for c, k, _, _ in described if source_expression(c, k) is not None)
    skipped = tuple(c for c, k, _, _ in described if source_expression(c, k) is None)
    key = tuple(kinds[c.lower()][0] for c in key_columns if c.lower() in kinds) \
        if key_columns else primary
    # Ranges need an index that starts with the key (else each chunk scans the table)
    # and an order both sides share.
    indexed = any([c.lower() for c in cols[:len(key)]] == [k.lower() for k in key]
                  for cols in indexes.values())
    ranged = bool(key) and indexed and all(
        orders_alike(kinds[k.lower()][1], kinds[k.lower()][2]) for k in key)
    return SourceTable(database, table, columns, key, ranged, skipped, primary)


@dataclass
class Snapshot:
    """One consistent snapshot on `db`: inside it, the binlog position it saw."""

    db: pymysql.Connection

    def __enter__(self) -> BinlogPosition:
        with self.db.cursor() as cur:
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
            status = {k.lower(): v for k, v in cur.fetchall()}
        return BinlogPosition.parse(status["binlog_snapshot_file"],
                                    status["binlog_snapshot_position"], int(time.time() * 1000))

    def __exit__(self, *exc: object) -> None:
        with self.db.cursor() as cur:
            cur.execute("COMMIT")


def chunk_checksums(db: pymysql.Connection, table: SourceTable, rows: int,
                    pause: float = 0.0) -> Iterator[ChunkChecksum]:
    """The table's chunks in key order, each walked and summed in its own snapshot."""
    import time

    lower: Key | None = None
    first = True
    while first or lower is not None:
        if not first and pause:
            time.sleep(pause)
        first = False
        with Snapshot(db) as position:
            upper = _next_upper(db, table, lower, rows) if table.ranged else None
            key_range = KeyRange(lower, upper)
            count, total, xor = _aggregate(db, table, key_range)
        yield ChunkChecksum(key_range, count, total, xor, position)
        lower = upper


def chunk_again(db: pymysql.Connection, table: SourceTable, key_range: KeyRange
                ) -> ChunkChecksum:
    """One chunk's checksum taken anew, in a new snapshot (the re-check)."""
    with Snapshot(db) as position:
        count, total, xor = _aggregate(db, table, key_range)
    return ChunkChecksum(key_range, count, total, xor, position)


def row_crcs(db: pymysql.Connection, table: SourceTable, key_range: KeyRange
             ) -> tuple[dict[Key, int], BinlogPosition]:
    """Key -> row CRC of one chunk (a differing chunk's rows, to name the keys: CRCs and
    keys leave the server, never the rows), and the snapshot position."""
    where, params = range_sql(table.key, key_range) if table.ranged else ("TRUE", [])
    # A keyless table's rows are keyed by their order here: only their CRCs count.
    key = ", ".join(quote(c) for c in table.key) or "NULL"
    with Snapshot(db) as position, db.cursor() as cur:
        cur.execute(f"SELECT {row_crc_sql(table.columns)}, {key} FROM {table.sql_name} "
                    f"WHERE {where}", params)
        found = cur.fetchall()
    if not table.key:
        return {(i,): int(r[0]) for i, r in enumerate(found)}, position
    return {tuple(key_value(v) for v in r[1:]): int(r[0]) for r in found}, position


def _next_upper(db: pymysql.Connection, table: SourceTable, lower: Key | None,
                rows: int) -> Key | None:
    sql, params = next_upper_sql(table.sql_name, table.key, lower, rows)
    with db.cursor() as cur:
        cur.execute(sql, params)
        found = cur.fetchone()
    return None if found is None else tuple(key_value(v) for v in found)


def _aggregate(db: pymysql.Connection, table: SourceTable, key_range: KeyRange
               ) -> tuple[int, int, int]:
    where, params = range_sql(table.key, key_range) if table.ranged else ("TRUE", [])
    with db.cursor() as cur:
        cur.execute(chunk_sql(table.sql_name, table.columns, where), params)
        count, total, xor = cur.fetchone()
    return int(count), int(total), int(xor)


def binlog_tables_between(db: pymysql.Connection, start: tuple[int, int] | None,
                          end: BinlogPosition, limit: int = 100_000) -> set[str] | None:
    """`db.table` of every row event in the binlog from the transaction after `start`
    (file index, position: a change the changelog holds; None: from the oldest binlog)
    up to `end`; None when more than `limit` events lie between or the binlog cannot be
    read there (the caller then waits for the changelog instead)."""
    import pymysql

    with db.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        files = [BinlogPosition.parse(r[0], 0) for r in cur.fetchall()]
        if start is not None and start[0] not in {f.file for f in files}:
            return None  # purged from where the changelog stands: what lies between is unknown
        tables: set[str] = set()
        seen, skipping = 0, start is not None
        first = start or ((files[0].file, 4) if files else (end.file, 4))
        for f in files:
            if f.file < first[0] or f.file > end.file:
                continue
            offset = first[1] if f.file == first[0] else 4
            try:
                cur.execute(f"SHOW BINLOG EVENTS IN %s FROM {int(offset)} LIMIT {int(limit)}",
                            (f.name,))
            except pymysql.err.MySQLError:
                return None  # purged, or not an event's start: unknown, so wait
            for _log, pos, kind, _server, _end, info in cur.fetchall():
                seen += 1
                if seen > limit:
                    return None
                if (f.file, pos) >= (end.file, end.pos):
                    return tables
                if skipping:
                    # The transaction at `start` is in the changelog already.
                    skipping = not (kind == "Xid" or (kind == "Query" and info == "COMMIT"))
                    continue
                if kind == "Table_map":
                    m = re.search(r"\(([^()]*)\)\s*$", info or "")
                    if m:
                        tables.add(m.group(1).replace("`", ""))
    return tables

