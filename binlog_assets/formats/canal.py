"""Canal flat-message JSON -> ChangeEvents, one per row of the message.

A message carries many rows of one table (`data`, with `old` aligned to it holding the
changed columns' previous values); each row becomes its own event in list order, told
apart by `row_index`. Every value arrives as text and is typed with the column's
`mysqlType` (ints, floats, Decimal, date/datetime, latin-1 bytes for binary columns; null
stays None); a value that does not parse as its declared type is a DecodeError rather than
a string smuggled into a typed column. Messages with `isDdl` become `ddl` events (a
TRUNCATE becomes op `t`); DDL naming no table (CREATE DATABASE) is skipped and counted.
Canal carries no binlog coordinate, so the position is zeros and Kafka order decides.
"""

from __future__ import annotations

from typing import Any

from binlog_assets.formats.base import ChangeDecoder, KafkaRecord, split_key_change
from binlog_assets.formats.event import (
    OP_CREATE,
    OP_DDL,
    OP_DELETE,
    OP_TRUNCATE,
    OP_UPDATE,
    ChangeEvent,
    Position,
)
from binlog_assets.formats.mysql_types import MysqlType, mysql_type

_ROW_OPS = {"INSERT": OP_CREATE, "UPDATE": OP_UPDATE, "DELETE": OP_DELETE}
_NO_POSITION = Position()


class CanalDecoder(ChangeDecoder):
    """Decodes Canal's flat-message JSON (the Kafka/RocketMQ `flatMessage` output)."""

    name = "canal"

    def _decode(self, record: KafkaRecord) -> list[ChangeEvent]:
        value, topic, partition, offset, key, _headers = record
        doc = self._load_object(value)
        kind = self._required_str(doc, "type")
        source_ts = doc.get("es")
        if source_ts is not None and type(source_ts) is not int:
            raise self._fail("field 'es' must be an integer (milliseconds)")
        if doc.get("isDdl"):
            return self._ddl(doc, kind, source_ts, topic, partition, offset)
        op = _ROW_OPS.get(kind)
        if op is None:
            return self._skip(f"unknown_op:{kind}")

        table = self._table(doc.get("database"), doc.get("table"), "database", "table")
        data = doc.get("data")
        if type(data) is not list:
            raise self._fail("field 'data' must be a list of rows")
        old = doc.get("old")
        if old is not None and (type(old) is not list or len(old) != len(data)):
            raise self._fail("field 'old' must be null or a list aligned with 'data'")
        types = self._column_types(doc.get("mysqlType"))
        column_types = {column: t.canonical for column, t in types.items() if t.canonical}
        columns = self._key_override(table)
        if columns is None:
            columns = self._declared_key_columns(doc.get("pkNames"), "pkNames")

        events: list[ChangeEvent] = []
        for index, raw_row in enumerate(data):
            row = self._typed_row(raw_row, types, f"data[{index}]")
            if op == OP_UPDATE:
                old_row = self._typed_row(old[index], types, f"old[{index}]") if old else {}
                before: dict[str, Any] | None = {**row, **old_row}
                after: dict[str, Any] | None = row
            elif op == OP_DELETE:
                before, after = row, None
            else:
                before, after = None, row
            row_key = self._row_key(row, columns, f"data[{index}]") if columns else ()
            event = ChangeEvent(table, op, row_key, columns, before, after, _NO_POSITION,
                                source_ts, topic, partition, offset, len(events), None,
                                column_types)
            if op == OP_UPDATE and columns:
                old_key = self._row_key(before, columns, f"old[{index}]")
                if old_key != row_key:
                    events.extend(split_key_change(event, old_key))
                    continue
            events.append(event)
        return events

    def _column_types(self, declared: Any) -> dict[str, MysqlType]:
        if declared is None:
            return {}
        if type(declared) is not dict:
            raise self._fail("field 'mysqlType' must be an object")
        types = {}
        for column, type_name in declared.items():
            if type(type_name) is not str:
                raise self._fail(f"field 'mysqlType.{column}' must be a string")
            types[column] = mysql_type(type_name)
        return types

    def _typed_row(self, raw: Any, types: dict[str, MysqlType], where: str) -> dict[str, Any]:
        if type(raw) is not dict:
            raise self._fail(f"field {where!r} must be an object")
        row: dict[str, Any] = {}
        for column, text in raw.items():
            if text is None:
                row[column] = None
                continue
            if type(text) is not str:
                raise self._fail(f"field '{where}.{column}' must be a string or null")
            column_type = types.get(column)
            if column_type is None:
                row[column] = text
                continue
            try:
                row[column] = column_type.parse(text)
            except (ValueError, ArithmeticError) as exc:
                raise self._fail(
                    f"field '{where}.{column}' value {text!r} does not parse as "
                    f"{column_type.canonical} ({exc})"
                ) from None
        return row

    def _ddl(
        self,
        doc: dict[str, Any],
        kind: str,
        source_ts: int | None,
        topic: str,
        partition: int,
        offset: int,
    ) -> list[ChangeEvent]:
        if not doc.get("table"):
            return self._skip("canal:ddl_without_table")
        table = self._table(doc.get("database"), doc.get("table"), "database", "table")
        sql = doc.get("sql")
        if sql is not None and type(sql) is not str:
            raise self._fail("field 'sql' must be a string")
        op = OP_TRUNCATE if kind == "TRUNCATE" else OP_DDL
        return [
            ChangeEvent(table, op, (), (), None, None, _NO_POSITION, source_ts,
                        topic, partition, offset, 0, sql)
        ]
