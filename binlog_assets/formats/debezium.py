"""Debezium (MySQL / MariaDB connector) JSON change events -> ChangeEvents; the hot path.

Accepts bare envelopes and the `{"schema": ..., "payload": ...}` form. Ops c/u/d/r/t are
changes; `m` and unknown ops are skipped and counted. The position is the source's binlog
(file suffix, pos, row); what a snapshot reads counts at the binlog position the snapshot
was taken at, just below what is streamed from there, and the last row a snapshot reads
of a table is followed by that table's snapshot end (a truncate just below the
snapshot's rows: whatever the snapshot did not read is gone at the source).
Primary-key columns come from the per-table override, else from the Kafka record key
(`{"id": 1}` or its schema-wrapped form); without either the key is empty. When a schema
block is present, logical types (Decimal, dates, timestamps, bytes) become Python values,
and TIME the text every format gives it (`mysql_types.time_text`), with one converter plan
built and cached per distinct row schema; a schema block seen before is recognised by its
raw bytes and not parsed again. Records of the schema-change topic (`ddl`,
`databaseName`, `tableChanges`) become `ddl` events, one per changed table.
"""

from __future__ import annotations

import re
from base64 import b64decode
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, NamedTuple

import orjson

from binlog_assets.formats.base import (
    ChangeDecoder,
    KafkaRecord,
    loads_exact,
    long_number_in,
    may_have_lost_digits,
    snapshot_end,
    split_key_change,
)
from binlog_assets.formats.event import (
    DATABASE_WIDE,
    OP_DDL,
    OP_DELETE,
    OP_READ,
    OP_TRUNCATE,
    OP_UPDATE,
    SNAPSHOT_ROW,
    SNAPSHOT_SCHEMA_ROW,
    ChangeEvent,
    Position,
    dropped_database,
)
from binlog_assets.formats.mysql_types import mysql_type, time_text

_ROW_OPS = frozenset({"c", "u", "d", "r", "t"})

_EPOCH = datetime(1970, 1, 1)
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_DECIMAL = "org.apache.kafka.connect.data.Decimal"

# Quoted parts of a tableChanges id such as "inventory"."products".
_QUOTED_PART = re.compile(r'"((?:[^"]|"")*)"')

_SCHEMA_OPEN = b'{"schema":'
_PAYLOAD_KEY = b',"payload":'

# Distinct row schemas are few (one per table version); the bound guards a runaway.
_MAX_CACHED_PLANS = 4096
# `source.snapshot` of a table's last row in a snapshot (`last`: the snapshot's last row).
_TABLE_DONE = frozenset({"last_in_data_collection", "last"})

# A double holds every decimal of at most this many digits as written.
_DOUBLE_DIGITS = 15

# Schema parameters of a field when the connector runs with column.propagate.source.type
# (or datatype.propagate.source.type) covering the column: its MySQL type, exactly.
_SOURCE_TYPE = "__debezium.source.column.type"
_SOURCE_LENGTH = "__debezium.source.column.length"
_SOURCE_SCALE = "__debezium.source.column.scale"


def _date_from_days(days: int) -> date:
    return date.fromordinal(_EPOCH_ORDINAL + days)


def _timestamp_from_millis(millis: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=millis)


def _timestamp_from_micros(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def _timestamp_from_nanos(nanos: int) -> datetime:
    # datetime resolves microseconds; the nanosecond remainder is dropped.
    return _EPOCH + timedelta(microseconds=nanos // 1000)


def _time_from_millis(millis: int) -> str:
    return time_text(millis * 1000)


def _time_from_nanos(nanos: int) -> str:
    # As for timestamps, the nanosecond remainder is dropped (MySQL keeps microseconds).
    micros = abs(nanos) // 1000
    return time_text(-micros if nanos < 0 else micros)


def _unsigned_long(value: int) -> int:
    # bigint.unsigned.handling.mode=long sends a BIGINT UNSIGNED as the Java long of the
    # same 64 bits: 18446744073709551351 arrives as -265.
    return value + 2**64 if value < 0 else value


def _zoned_timestamp(text: str) -> datetime:
    parsed = datetime.fromisoformat(text)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _decimal_converter(scale: int) -> Callable[[Any], Decimal]:
    def convert(value: Any) -> Decimal:
        if type(value) is not str:  # JsonConverter with decimal.format=NUMERIC
            # A double here holds the number as written (see `_parse`): str() is exact.
            return value if type(value) is Decimal else Decimal(str(value))
        unscaled = int.from_bytes(b64decode(value), "big", signed=True)
        # Built from text so that no context precision rounds a DECIMAL(65, 30).
        return Decimal(f"{unscaled}E-{scale}")

    return convert


# Connect schema `type` -> canonical type, when no logical `name` says more.
_PRIMITIVE_TYPES = {
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "bigint",
    "float32": "float",
    "float64": "double",
    # Some producers (and Flink's Debezium fixtures) spell the floating types this way.
    "float": "float",
    "double": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "binary",
}

# Logical schema `name` -> (canonical type, converter or None when the JSON value is final).
_LOGICAL_TYPES: dict[str, tuple[str, Callable[[Any], Any] | None]] = {
    "io.debezium.time.Date": ("date", _date_from_days),
    "org.apache.kafka.connect.data.Date": ("date", _date_from_days),
    "io.debezium.time.Timestamp": ("timestamp", _timestamp_from_millis),
    "org.apache.kafka.connect.data.Timestamp": ("timestamp", _timestamp_from_millis),
    "io.debezium.time.MicroTimestamp": ("timestamp", _timestamp_from_micros),
    "io.debezium.time.NanoTimestamp": ("timestamp", _timestamp_from_nanos),
    "io.debezium.time.ZonedTimestamp": ("timestamp", _zoned_timestamp),
    # TIME is text in every format (see mysql_types); Debezium sends a count of units.
    "io.debezium.time.MicroTime": ("string", time_text),
    "io.debezium.time.Time": ("string", _time_from_millis),
    "io.debezium.time.NanoTime": ("string", _time_from_nanos),
    "org.apache.kafka.connect.data.Time": ("string", _time_from_millis),
    "io.debezium.data.Json": ("json", None),
    "io.debezium.time.Year": ("int", None),
}


class _RowPlan(NamedTuple):
    """How to turn one row schema's JSON values into Python values, built once per schema."""

    converters: tuple[tuple[str, Callable[[Any], Any]], ...]
    column_types: dict[str, str]
    # DECIMAL columns too wide for a double: sent as JSON numbers (decimal.format=NUMERIC),
    # their values must not go through one.
    wide_decimals: tuple[str, ...] = ()


def _build_plan(fields: list[dict[str, Any]]) -> _RowPlan:
    converters: list[tuple[str, Callable[[Any], Any]]] = []
    column_types: dict[str, str] = {}
    wide_decimals: list[str] = []
    for field in fields:
        column = field["field"]
        name = field.get("name")
        parameters = field.get("parameters") or {}
        converter: Callable[[Any], Any] | None = None
        if name == _DECIMAL:
            scale = int(parameters.get("scale", 0))
            precision = int(parameters.get("connect.decimal.precision", 38))
            canonical: str | None = f"decimal({precision},{scale})"
            converter = _decimal_converter(scale)
            if precision > _DOUBLE_DIGITS:
                wide_decimals.append(column)
        elif name in _LOGICAL_TYPES:
            canonical, converter = _LOGICAL_TYPES[name]
        else:
            canonical = _PRIMITIVE_TYPES.get(field.get("type"))
            if canonical == "binary":
                converter = b64decode
        source_type = parameters.get(_SOURCE_TYPE)
        if source_type is not None:
            # The column's own type says what the Connect type cannot: INT UNSIGNED is a
            # bigint, BIGINT UNSIGNED a decimal(20,0), DECIMAL(p,s) keeps p and s.
            declared = mysql_type(str(source_type), _int_parameter(parameters, _SOURCE_LENGTH),
                                  _int_parameter(parameters, _SOURCE_SCALE)).canonical
            if declared == "decimal(20,0)" and canonical == "bigint":
                converter = _unsigned_long
            canonical = declared or canonical
        if canonical is not None:
            column_types[column] = canonical
        if converter is not None:
            converters.append((column, converter))
    return _RowPlan(tuple(converters), column_types, tuple(wide_decimals))


_NO_PLAN = _RowPlan((), {})


def _int_parameter(parameters: dict[str, Any], name: str) -> int | None:
    value = parameters.get(name)
    return int(value) if value is not None else None


def _table_definition(definition: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, str]]:
    """Primary-key columns and canonical column types of a tableChanges[].table block."""
    columns = tuple(str(name) for name in definition.get("primaryKeyColumnNames") or ())
    column_types = {}
    for column in definition.get("columns") or ():
        canonical = mysql_type(
            column.get("typeName") or "", column.get("length"), column.get("scale")
        ).canonical
        if canonical is not None:
            column_types[str(column["name"])] = canonical
    return columns, column_types


def _rounded(raw: bytes, envelope: Any, plan: _RowPlan | None) -> bool:
    """Whether orjson may have rounded a value of the envelope's row images: with a
    schema, only a wide DECIMAL sent as a number can have been; without, any double."""
    if type(envelope) is not dict or (plan is not None and not plan.wide_decimals):
        return False
    before, after = envelope.get("before"), envelope.get("after")
    if plan is None:
        return may_have_lost_digits(raw, before, after)
    for image in (before, after):
        if type(image) is dict and any(type(image.get(c)) is float for c in plan.wide_decimals):
            return long_number_in(raw)
    return False


class DebeziumDecoder(ChangeDecoder):
    """Decodes Debezium MySQL/MariaDB JSON records (with or without the schema block)."""

    name = "debezium"

    def __init__(self, key_columns: Mapping[str, Sequence[str]] | None = None) -> None:
        super().__init__(key_columns)
        self._plans: dict[bytes, _RowPlan] = {}
        self._plans_by_prefix: dict[bytes, _RowPlan] = {}
        # table -> (the `"column":` markers of its Kafka keys, the key's column names)
        self._key_shapes: dict[str, tuple[tuple[bytes, ...], tuple[str, ...]]] = {}

    def _decode(self, record: KafkaRecord) -> list[ChangeEvent]:
        doc, plan = self._parse(record[0])
        return self._events(doc, plan, record)

    def _events(self, doc: Any, plan: _RowPlan | None, record: KafkaRecord) -> list[ChangeEvent]:
        """The row changes (or DDL) of one envelope, whatever encoding carried it."""
        _value, topic, partition, offset, key, _headers = record
        if doc is None:
            return self._skip("tombstone")
        if type(doc) is not dict:
            raise self._fail("field 'payload' must be an object")
        op = doc.get("op")
        if op is None:
            if "ddl" in doc:
                return self._schema_change(doc, topic, partition, offset)
            if doc.get("status") in ("BEGIN", "END"):
                return self._skip("debezium:transaction")
            if doc.keys() == {"ts_ms"}:
                return self._skip("debezium:heartbeat")  # its topic holds only the time
            raise self._fail("missing field 'op'")
        if type(op) is not str:
            raise self._fail("field 'op' must be a string")
        if op not in _ROW_OPS:
            return self._skip(f"unknown_op:{op}")

        source = doc.get("source")
        if type(source) is not dict:
            raise self._fail("missing or invalid field 'source'")
        table = self._table(source.get("db"), source.get("table"), "source.db", "source.table")
        position = self._position(source, op)
        source_ts = source.get("ts_ms") or doc.get("ts_ms")
        if source_ts is not None and type(source_ts) is not int:
            raise self._fail("field 'source.ts_ms' (or 'ts_ms') must be an integer")
        server_id, gtid = self._origin(source)
        if op == OP_TRUNCATE:
            return [
                ChangeEvent(table, op, (), (), None, None, position, source_ts,
                            topic, partition, offset, server_id=server_id, gtid=gtid)
            ]

        before = doc.get("before")
        after = doc.get("after")
        if before is not None and type(before) is not dict:
            raise self._fail("field 'before' must be an object or null")
        if after is not None and type(after) is not dict:
            raise self._fail("field 'after' must be an object or null")
        image, image_name = (before, "before") if op == OP_DELETE else (after, "after")
        if image is None:
            raise self._fail(f"field {image_name!r} is null for op {op!r}")

        column_types = None
        if plan is not None:
            if plan.converters:
                if before is not None:
                    self._convert(before, plan, "before")
                if after is not None:
                    self._convert(after, plan, "after")
            # Shared by every event of this schema: consumers treat it as read-only.
            column_types = plan.column_types or None

        columns = self._key_override(table)
        if columns is None:
            columns = self._key_columns_of(table, key) if key is not None else ()
        row_key = self._row_key(image, columns, image_name) if columns else ()
        event = ChangeEvent(table, op, row_key, columns, before, after, position, source_ts,
                            topic, partition, offset, 0, None, column_types, server_id, gtid)
        if op == OP_UPDATE and columns and before is not None:
            old_key = self._row_key(before, columns, "before")
            if old_key != row_key:
                return split_key_change(event, old_key)
        snapshot = source.get("snapshot")
        if type(snapshot) is str and snapshot in _TABLE_DONE:
            if snapshot == "last":
                # The whole snapshot ended: a table it found empty has no row to end it.
                self.snapshots_ended.append((position, str(source.get("name") or "")))
            return [event, snapshot_end(event)]
        return [event]

    def _parse(self, value: bytes) -> tuple[Any, _RowPlan | None]:
        """The envelope, unwrapped from `{"schema":…,"payload":…}`, and the schema's plan.

        Re-parsing an unchanged schema block costs most of a schema-include record, so a
        value that starts with the exact bytes of a schema seen before (verified once, in
        `_remember_prefix`) only has its payload parsed. A record whose row images may
        hold a number a double rounded (a DECIMAL sent as a JSON number: schema-less, or
        a schema with a decimal of more than 15 digits) is parsed again, exactly.
        """
        if value.startswith(_SCHEMA_OPEN):
            cut = value.find(_PAYLOAD_KEY)
            plan = self._plans_by_prefix.get(value[:cut]) if cut > 0 else None
            if plan is not None and value.endswith(b"}"):
                payload = value[cut + len(_PAYLOAD_KEY) : -1]
                try:
                    doc = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    pass  # not exactly {"schema":…,"payload":…}: parse it whole below
                else:
                    if plan.wide_decimals and _rounded(payload, doc, plan):
                        doc = loads_exact(payload)
                    return doc, plan
        doc = self._load_object(value)
        wrapped = "op" not in doc and "payload" in doc
        plan = None
        if wrapped and (schema := doc.get("schema")) is not None:
            plan = self._plan(schema)
            self._remember_prefix(value, schema, plan)
        if _rounded(value, doc["payload"] if wrapped else doc, plan):
            doc = self._load_object(value, exact=True)
        return (doc["payload"] if wrapped else doc), plan

    def _remember_prefix(self, value: bytes, schema: dict[str, Any], plan: _RowPlan) -> None:
        if not value.startswith(_SCHEMA_OPEN):
            return
        cut = value.find(_PAYLOAD_KEY)
        # Only a prefix that is exactly `{"schema":` + the whole schema JSON may stand for
        # it; a "payload" key nested inside the schema fails this check.
        try:
            if cut < 0 or orjson.loads(value[len(_SCHEMA_OPEN) : cut]) != schema:
                return
        except orjson.JSONDecodeError:
            return
        if len(self._plans_by_prefix) >= _MAX_CACHED_PLANS:
            self._plans_by_prefix.clear()
        self._plans_by_prefix[value[:cut]] = plan

    def _position(self, source: dict[str, Any], op: str | None) -> Position:
        snapshot = source.get("snapshot")
        streamed = (snapshot is None or snapshot == "false" or snapshot is False) and op != OP_READ
        file_name = source.get("file")
        file_index = self._binlog_index(file_name, "source.file") if file_name else 0
        pos = source.get("pos") or 0
        row = source.get("row") or 0
        if type(pos) is not int:
            raise self._fail("field 'source.pos' must be an integer")
        if type(row) is not int:
            raise self._fail("field 'source.row' must be an integer")
        # A snapshot's rows count at the position it read at, below what streams from there.
        return Position(file=file_index, pos=pos, row=row if streamed else SNAPSHOT_ROW)

    def _origin(self, source: dict[str, Any]) -> tuple[int | None, str | None]:
        """The server id and GTID the change was written with; a snapshot read has none
        (Debezium gives server id 0)."""
        server_id, gtid = source.get("server_id"), source.get("gtid")
        if server_id is not None and type(server_id) is not int:
            raise self._fail("field 'source.server_id' must be an integer")
        if gtid is not None and type(gtid) is not str:
            raise self._fail("field 'source.gtid' must be a string")
        return server_id or None, gtid or None

    def _convert(self, row: dict[str, Any], plan: _RowPlan, image_name: str) -> None:
        for column, convert in plan.converters:
            raw = row.get(column)
            if raw is not None:
                try:
                    row[column] = convert(raw)
                except (ValueError, TypeError, ArithmeticError) as exc:
                    raise self._fail(
                        f"field '{image_name}.{column}' does not match its schema type: {exc}"
                    ) from None

    def _key_columns_of(self, table: str, key: bytes) -> tuple[str, ...]:
        """The key's column names. Every key of a table has the same columns, so once
        seen they are checked by substring (each `"column":` is in the key) instead of
        parsing the key's JSON on every record; the key values come from the row image."""
        shape = self._key_shapes.get(table)
        if shape is not None and key.startswith(b'{"'):
            markers, columns = shape
            if all(m in key for m in markers) and key.count(b'":') == len(markers):
                return columns
        columns = self._kafka_key_columns(key)
        self._key_shapes[table] = (tuple(orjson.dumps(c) + b":" for c in columns), columns)
        return columns

    def _kafka_key_columns(self, key: bytes) -> tuple[str, ...]:
        try:
            key_doc = orjson.loads(key)
        except orjson.JSONDecodeError as exc:
            raise self._fail(f"Kafka record key is not valid JSON: {exc}") from None
        if type(key_doc) is dict and len(key_doc) == 2 and type(key_doc.get("schema")) is dict:
            key_doc = key_doc.get("payload")
        if type(key_doc) is not dict:
            raise self._fail("Kafka record key must be a JSON object of key columns")
        return tuple(key_doc)

    def _plan(self, schema: Any) -> _RowPlan:
        if type(schema) is not dict:
            raise self._fail("field 'schema' must be an object")
        envelope_fields = schema.get("fields") or []
        if type(envelope_fields) is not list:
            raise self._fail("field 'schema.fields' must be a list")
        row_schema = None
        for field in envelope_fields:
            if type(field) is not dict:
                raise self._fail("field 'schema.fields[]' must be objects")
            if field.get("field") == "after":
                row_schema = field
                break
            if field.get("field") == "before":
                row_schema = field
        if row_schema is None:
            return _NO_PLAN
        fields = row_schema.get("fields") or []
        # Parsed JSON is new on every record, so the schema's serialized text is its identity.
        cache_key = orjson.dumps(fields)
        plan = self._plans.get(cache_key)
        if plan is None:
            try:
                plan = _build_plan(fields)
            except (KeyError, TypeError, AttributeError, ValueError) as exc:
                raise self._fail(
                    f"field 'schema' has a malformed row schema: {type(exc).__name__}: {exc}"
                ) from None
            if len(self._plans) >= _MAX_CACHED_PLANS:
                self._plans.clear()
            self._plans[cache_key] = plan
        return plan

    def _schema_change(
        self, doc: dict[str, Any], topic: str, partition: int, offset: int
    ) -> list[ChangeEvent]:
        ddl = doc["ddl"]
        if type(ddl) is not str:
            raise self._fail("field 'ddl' must be a string")
        source = doc.get("source") or {}
        if type(source) is not dict:
            raise self._fail("field 'source' must be an object")
        position = self._position(source, None) if source else Position()
        if position.row == SNAPSHOT_ROW:
            # A snapshot replays each table's schema (DROP TABLE IF EXISTS, DROP DATABASE
            # IF EXISTS, CREATE TABLE) and then reads its rows, all at the one binlog
            # position the snapshot started from, into other topics than this one: their
            # Kafka offsets do not say which came first. The schema did.
            position = position._replace(row=SNAPSHOT_SCHEMA_ROW)
        server_id, gtid = self._origin(source)
        source_ts = source.get("ts_ms") or doc.get("ts_ms")
        database = doc.get("databaseName") or source.get("db")
        changes = doc.get("tableChanges") or []
        if type(changes) is not list:
            raise self._fail("field 'tableChanges' must be a list")

        events: list[ChangeEvent] = []
        for index, change in enumerate(changes):
            table = self._table_change_name(change, database)
            try:
                columns, column_types = _table_definition(change.get("table") or {})
            except (KeyError, TypeError, AttributeError, ValueError) as exc:
                raise self._fail(
                    f"field 'tableChanges[{index}].table' is malformed: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            events.append(
                ChangeEvent(table, OP_DDL, (), columns, None, None, position, source_ts,
                            topic, partition, offset, index, ddl, column_types or None,
                            server_id, gtid)
            )
        if not events and type(database) is str and dropped_database(ddl) == database:
            # Debezium lists no tables for a dropped database; replicas still must know.
            events.append(
                ChangeEvent(f"{database}.{DATABASE_WIDE}", OP_DDL, (), (), None, None,
                            position, source_ts, topic, partition, offset, 0, ddl,
                            server_id=server_id, gtid=gtid))
        if not events:
            if not (database and source.get("table")):
                return self._skip("debezium:ddl_without_table")
            table = self._table(database, source.get("table"), "databaseName", "source.table")
            events.append(
                ChangeEvent(table, OP_DDL, (), (), None, None, position, source_ts,
                            topic, partition, offset, 0, ddl, server_id=server_id, gtid=gtid)
            )
        return events

    def _table_change_name(self, change: Any, database: Any) -> str:
        if type(change) is not dict or type(change.get("id")) is not str:
            raise self._fail("field 'tableChanges[].id' must be a string")
        table_id = change["id"]
        parts = [part.replace('""', '"') for part in _QUOTED_PART.findall(table_id)]
        if not parts:
            parts = table_id.split(".")
        if len(parts) == 1:
            return self._table(database, parts[0], "databaseName", "tableChanges[].id")
        return self._table(parts[0], parts[-1], "tableChanges[].id", "tableChanges[].id")
