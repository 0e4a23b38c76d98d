"""A chunk of a source table read for a load: over mysqlclient (libmariadb, C), inside
its own consistent snapshot, and turned into changelog rows as the stream's decoder
would write them: `r` events at the snapshot's binlog position, each row's values typed
by its column's canonical type (`formats/mysql_types.py`), with the column types declared
as a stream's events declare them.

mysqlclient rather than PyMySQL: a load reads every row of the table, and parsing rows
in Python was most of a Python read's time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from binlog_assets.formats.event import OP_READ
from binlog_assets.formats.mysql_types import infer_types, mysql_type, time_text
from binlog_assets.lakehouse.changelog_rows import to_json
from binlog_assets.parity.chunks import range_sql
from binlog_assets.parity.source import BinlogPosition, Snapshot

if TYPE_CHECKING:
    from binlog_assets.config.parity import SourceConnection
    from binlog_assets.parity.chunks import KeyRange
    from binlog_assets.parity.source import SourceTable

# Rows fetched from the server at a time: the chunk's rows stream, never held twice.
FETCH_ROWS = 10_000


def connect_reader(conn: SourceConnection) -> Any:
    """A read-only mysqlclient session in UTC (TIMESTAMP values read as replicas hold
    them), with the parity connection's TLS settings."""
    import MySQLdb

    ssl = None
    if conn.tls is not None and conn.tls.mode != "disabled":
        ssl = {k: v for k, v in {"ca": conn.tls.ca, "cert": conn.tls.cert,
                                 "key": conn.tls.key}.items() if v is not None}
    mode = None if conn.tls is None else {
        "disabled": "DISABLED", "required": "REQUIRED", "verify_ca": "VERIFY_CA",
        "verify_identity": "VERIFY_IDENTITY"}[conn.tls.mode]
    options: dict[str, Any] = {"ssl_mode": mode} if mode else {}
    if ssl:
        options["ssl"] = ssl
    db = MySQLdb.connect(host=conn.host, port=conn.port, user=conn.user,
                         password=conn.password, charset="utf8mb4", autocommit=True,
                         connect_timeout=max(1, int(conn.connect_timeout_seconds)),
                         conv=_conversions(), **options)
    with db.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+00:00'")
        cur.execute("SET SESSION TRANSACTION READ ONLY")
    return db


def _conversions() -> dict:
    """mysqlclient's conversions, with dates and times of day parsed in C: its own
    parser, in Python, was a tenth of a load's time per DATETIME column (the same
    values, None for a zero or invalid date as before)."""
    from MySQLdb.constants import FIELD_TYPE
    from MySQLdb.converters import conversions

    return {**conversions, FIELD_TYPE.DATETIME: _datetime, FIELD_TYPE.TIMESTAMP: _datetime,
            FIELD_TYPE.DATE: _date}


def _datetime(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _date(text: str) -> date | None:
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class LoadColumns:
    """The table's columns as a load writes them: names in table order, the canonical
    types declared for them (JSON, as a changelog row holds it), and a converter per
    column whose driver value is not the stream's (None: kept as read)."""

    names: tuple[str, ...]
    declared_map: dict[str, str]
    declared: str | None  # `declared_map` as JSON, written on every row
    converters: tuple[Callable[[Any], Any] | None, ...]

    @property
    def all_declared(self) -> bool:
        return len(self.declared_map) == len(self.names)


def load_columns(db: Any, table: SourceTable) -> LoadColumns:
    """From information_schema: each column's canonical type by its full COLUMN_TYPE, as
    Debezium's source-type parameters give it to the stream's decoder."""
    with db.cursor() as cur:
        cur.execute("SELECT column_name, column_type FROM information_schema.columns WHERE "
                    "table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                    (table.database, table.table))
        described = [(str(n), str(t)) for n, t in cur.fetchall()]
    declared: dict[str, str] = {}
    converters: list[Callable[[Any], Any] | None] = []
    for name, column_type in described:
        canonical = mysql_type(column_type).canonical
        if canonical is None and column_type.lower() in ("bit(1)", "bit"):
            canonical = "boolean"  # Debezium sends BIT(1) as a Connect boolean
        if canonical is not None:
            declared[name] = canonical
        converters.append(_converter(column_type.lower(), canonical))
    return LoadColumns(tuple(n for n, _ in described), declared,
                       to_json(declared) if declared else None, tuple(converters))


def _converter(column_type: str, canonical: str | None) -> Callable[[Any], Any] | None:
    if column_type.startswith("time") and not column_type.startswith("timestamp"):
        return _time
    if column_type.startswith("set"):
        return _set
    if canonical == "boolean":
        return _bit
    if column_type.startswith("bit"):
        return _bits
    if canonical in ("string", "json"):
        return _text
    if canonical == "timestamp":
        return _instant
    return None


def _time(value: Any) -> Any:
    # TIME is text `[-]HH:MM:SS[.ffffff]` in every format (mysql_types.time_text).
    if isinstance(value, timedelta):
        return time_text(value // timedelta(microseconds=1))
    return value


def _set(value: Any) -> Any:
    if isinstance(value, set):  # the members, as the source lists them
        return ",".join(sorted(value))
    return _text(value)


def _bit(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return int.from_bytes(value, "big") != 0
    return None if value is None else bool(value)


def _bits(value: Any) -> Any:
    return int.from_bytes(value, "big") if isinstance(value, bytes | bytearray) else value


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes | bytearray) else value


def _instant(value: Any) -> Any:
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


@dataclass
class ChunkRead:
    """A chunk as read: the snapshot's position, and its changelog rows in batches."""

    position: BinlogPosition
    rows: int = 0


def read_chunk(db: Any, table: SourceTable, columns: LoadColumns, key_range: KeyRange,
               at: tuple[int, datetime], into: list[tuple],
               values: list[list] | None = None, topic: str = "") -> ChunkRead:
    """The rows of `key_range` read in one consistent snapshot, appended to `into` as
    `event_row` tuples (`lakehouse/changelog_rows.py`) at the snapshot's position of
    lineage `at[0]`, ingested at `at[1]`; as a re-sync's rows, with no topic, partition
    and offset -1 (`topic`: a direct load's, `direct.py`). With `values`, each row's
    values (in `columns.names` order, as the stream's decoder gives them) are appended
    to it too."""
    import MySQLdb.cursors

    lineage, now = at
    with Snapshot(db) as position:
        read = ChunkRead(position)
        where, params = range_sql(table.primary, key_range)
        names = ", ".join(f"`{n.replace('`', '``')}`" for n in columns.names)
        cur = db.cursor(MySQLdb.cursors.SSCursor)
        try:
            cur.execute(f"SELECT {names} FROM {table.sql_name} WHERE {where}", params)
            while batch := cur.fetchmany(FETCH_ROWS):
                into.extend(_rows(batch, table, columns, (lineage, position), now,
                                  start=read.rows, values=values, topic=topic))
                read.rows += len(batch)
        finally:
            cur.close()
    return read


def _rows(batch: Any, table: SourceTable, columns: LoadColumns,
          at: tuple[int, BinlogPosition], now: datetime, start: int,
          values: list[list] | None = None, topic: str = "") -> Iterator[tuple]:
    lineage, position = at
    names, converters = columns.names, columns.converters
    converted = [(i, c) for i, c in enumerate(converters) if c is not None]
    key_columns = list(table.primary)
    key_at = [names.index(k) for k in table.primary]
    declared, name, all_declared = columns.declared, table.name, columns.all_declared
    for i, row in enumerate(batch, start):
        if converted:
            row = list(row)
            for j, convert in converted:
                row[j] = convert(row[j])
        if values is not None:
            values.append(row)
        after = dict(zip(names, row, strict=True))
        value_types = None
        if not all_declared:
            inferred = infer_types((after,), columns.declared_map)
            value_types = to_json(inferred) if inferred else None
        yield (topic, -1, -1, i, name, OP_READ,
               to_json({k: row[j] for k, j in zip(key_columns, key_at, strict=True)}),
               key_columns, None, to_json(after), lineage, position.file, position.pos, 0,
               None, None, declared, value_types, None, now, None, None)
