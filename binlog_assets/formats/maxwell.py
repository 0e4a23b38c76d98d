"""Maxwell JSON rows -> ChangeEvents.

insert/update/delete are changes; bootstrap-insert is a snapshot read (op `r`) and
the bootstrap-start/complete markers are skipped and counted; table-create, table-alter
and table-drop are `ddl` events, while database-level DDL, which names no table, is
skipped and counted. Values are JSON-typed already; a number a double would round (a
DECIMAL of more than 15 digits) is parsed again into a Decimal. `old` holds only the
changed columns, so the before-image is `data` overlaid with `old`. Key columns come from the
per-table override, else `primary_key_columns`, else the Kafka record key
(`{"database":..,"table":..,"pk.id":..}` or the array form). `position`, `xoffset` and
`gtid` are opt-in producer settings: the position is the parsed `position` with `xoffset`
as the row, else the GTID sequence number, else zeros so the Kafka offset orders.
"""

from __future__ import annotations

from typing import Any

import orjson

from binlog_assets.formats.base import (
    ChangeDecoder,
    KafkaRecord,
    may_have_lost_digits,
    split_key_change,
)
from binlog_assets.formats.event import (
    OP_CREATE,
    OP_DDL,
    OP_DELETE,
    OP_READ,
    OP_UPDATE,
    SNAPSHOT_ROW,
    ChangeEvent,
    Position,
)
from binlog_assets.formats.mysql_types import mysql_type

_ROW_OPS = {
    "insert": OP_CREATE,
    "update": OP_UPDATE,
    "delete": OP_DELETE,
    "bootstrap-insert": OP_READ,
}
_TABLE_DDL = frozenset({"table-create", "table-alter", "table-drop"})
_SKIPPED_TYPES = frozenset(
    {"bootstrap-start", "bootstrap-complete", "database-create", "database-alter",
     "database-drop"}
)


class MaxwellDecoder(ChangeDecoder):
    """Decodes Maxwell's JSON output, one row (or DDL statement) per Kafka record."""

    name = "maxwell"

    def _decode(self, record: KafkaRecord) -> list[ChangeEvent]:
        value, topic, partition, offset, key, _headers = record
        doc = self._load_object(value)
        if may_have_lost_digits(value, doc.get("data"), doc.get("old")):
            # A DECIMAL is a JSON number here; one too long for a double keeps its digits.
            doc = self._load_object(value, exact=True)
        kind = self._required_str(doc, "type")
        if kind in _SKIPPED_TYPES:
            return self._skip(f"maxwell:{kind}")
        op = _ROW_OPS.get(kind)
        if op is None and kind not in _TABLE_DDL:
            return self._skip(f"unknown_op:{kind}")

        table = self._table(doc.get("database"), doc.get("table"), "database", "table")
        position = self._position(doc, snapshot=op == OP_READ)
        ts = doc.get("ts")
        if ts is not None and type(ts) is not int:
            raise self._fail("field 'ts' must be an integer (seconds)")
        source_ts = ts * 1000 if ts is not None else None
        if op is None:
            sql, columns, column_types = self._ddl_definition(doc)
            return [ChangeEvent(table, OP_DDL, (), columns, None, None, position, source_ts,
                                topic, partition, offset, 0, sql, column_types or None)]

        data = doc.get("data")
        if type(data) is not dict:
            raise self._fail("field 'data' must be an object")
        old = doc.get("old")
        if old is not None and type(old) is not dict:
            raise self._fail("field 'old' must be an object or null")
        if op == OP_UPDATE:
            before: dict[str, Any] | None = {**data, **old} if old else dict(data)
            after: dict[str, Any] | None = data
        elif op == OP_DELETE:
            before, after = data, None
        else:
            before, after = None, data

        columns = self._key_columns(table, doc, key)
        row_key = self._row_key(data, columns, "data") if columns else ()
        server_id, gtid = self._origin(doc)
        event = ChangeEvent(table, op, row_key, columns, before, after, position, source_ts,
                            topic, partition, offset, server_id=server_id, gtid=gtid)
        if op == OP_UPDATE and columns:
            old_key = self._row_key(before, columns, "old")
            if old_key != row_key:
                return split_key_change(event, old_key)
        return [event]

    def _position(self, doc: dict[str, Any], *, snapshot: bool) -> Position:
        # A bootstrap row counts at the position it carries, just below what streams from
        # there; Maxwell usually gives it none, and then it ranks below every change.
        position = self._binlog_position(doc)
        return position._replace(row=SNAPSHOT_ROW) if snapshot else position

    def _origin(self, doc: dict[str, Any]) -> tuple[int | None, str | None]:
        server_id, gtid = doc.get("server_id"), doc.get("gtid")
        if server_id is not None and type(server_id) is not int:
            raise self._fail("field 'server_id' must be an integer")
        return server_id or None, gtid if type(gtid) is str and gtid else None

    def _binlog_position(self, doc: dict[str, Any]) -> Position:
        xoffset = doc.get("xoffset") or 0
        if type(xoffset) is not int:
            raise self._fail("field 'xoffset' must be an integer")
        binlog_position = doc.get("position")
        if binlog_position is not None:
            if type(binlog_position) is not str:
                raise self._fail("field 'position' must be a string like 'master.000006:800911'")
            file_name, _, pos = binlog_position.rpartition(":")
            if not (pos.isascii() and pos.isdigit()):
                raise self._fail(f"field 'position' {binlog_position!r} has no numeric offset")
            return Position(file=self._binlog_index(file_name, "position"), pos=int(pos),
                            row=xoffset)
        gtid = doc.get("gtid")
        if gtid is not None:
            if type(gtid) is not str:
                raise self._fail("field 'gtid' must be a string")
            # MySQL GTIDs are uuid:seq, MariaDB's domain-server-seq.
            sequence = gtid.rpartition(":")[2] if ":" in gtid else gtid.rpartition("-")[2]
            if not (sequence.isascii() and sequence.isdigit()):
                raise self._fail(f"field 'gtid' {gtid!r} has no sequence number")
            return Position(pos=int(sequence), row=xoffset)
        # Without any binlog coordinate the Kafka offset alone must order, so no row either.
        return Position()

    def _key_columns(self, table: str, doc: dict[str, Any], key: bytes | None) -> tuple:
        columns = self._key_override(table)
        if columns is not None:
            return columns
        declared = doc.get("primary_key_columns")
        if declared is not None:
            return self._declared_key_columns(declared, "primary_key_columns")
        if key is None:
            return ()
        try:
            key_doc = orjson.loads(key)
        except orjson.JSONDecodeError as exc:
            raise self._fail(f"Kafka record key is not valid JSON: {exc}") from None
        if type(key_doc) is dict:
            return tuple(name[3:] for name in key_doc if name.startswith("pk."))
        # kafka_key_format=array: [database, table, [{column: value}, ...]]
        if type(key_doc) is list and len(key_doc) == 3 and type(key_doc[2]) is list:
            return tuple(column for part in key_doc[2] for column in part)
        raise self._fail("Kafka record key is neither Maxwell's hash nor array key format")

    def _ddl_definition(self, doc: dict[str, Any]
                        ) -> tuple[str | None, tuple[str, ...], dict[str, str]]:
        """A DDL record's statement, its table's primary-key columns and column types."""
        sql = doc.get("sql")
        if sql is not None and type(sql) is not str:
            raise self._fail("field 'sql' must be a string")
        definition = doc.get("def") or {}
        if type(definition) is not dict:
            raise self._fail("field 'def' must be an object")
        try:
            columns, column_types = _table_definition(definition)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise self._fail(f"field 'def' is malformed: {type(exc).__name__}: {exc}") from None
        return sql, columns, column_types


def _table_definition(definition: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, str]]:
    """Primary-key columns and canonical column types of a DDL record's `def` block."""
    column_types = {}
    for column in definition.get("columns") or ():
        type_name = column.get("type") or ""
        if column.get("signed") is False:
            type_name += " unsigned"
        column_type = mysql_type(type_name, column.get("precision"), column.get("scale"))
        if column_type.canonical is not None:
            column_types[str(column["name"])] = column_type.canonical
    return tuple(str(name) for name in definition.get("primary-key") or ()), column_types
