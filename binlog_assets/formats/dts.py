"""Alibaba DTS change-tracking records (Avro `com.alibaba.dts.formats.avro.Record`) -> ChangeEvents.

Values are schemaless Avro read with `dts_record.avsc`; for tests and hand-made input a
JSON object with the same fields is accepted too (a value starting with `{`, which no
Avro Record can: its first byte would encode version -62). In that JSON form each image
value is null or a one-key object naming its type (`{"Integer": {"precision": 4,
"value": "7"}}`, namespace optional) and bytes fields are strings of code points 0-255, as
in Avro's JSON encoding. INSERT/UPDATE/DELETE/DDL are changes; BEGIN, COMMIT, HEARTBEAT
and the other control operations are skipped and counted as `dts:<OPERATION>`. Image
values are typed unions unwrapped into Python values (see `_CONVERTERS`). `sourcePosition`
is required and must be `<binlog file name>:<offset>` (`mysql-bin.000123:4567`) or
`<offset>@<file index>` (`4567@123`, further `@`-separated numeric fields are ignored);
anything else is a DecodeError. Records carry no key list: key columns come from the
per-table override, else from the `pk_uk_info` tag (`{"PRIMARY": ["id"]}`) when present.
"""

from __future__ import annotations

import codecs
import io
import json
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import fastavro
import orjson

from binlog_assets.formats.base import ChangeDecoder, KafkaRecord, split_key_change
from binlog_assets.formats.event import (
    OP_CREATE,
    OP_DDL,
    OP_DELETE,
    OP_UPDATE,
    ChangeEvent,
    Position,
)
from binlog_assets.formats.mysql_types import integer_type, time_text

SCHEMA_PATH = Path(__file__).with_name("dts_record.avsc")
RECORD_SCHEMA = fastavro.parse_schema(json.loads(SCHEMA_PATH.read_text()))

_ROW_OPS = {"INSERT": OP_CREATE, "UPDATE": OP_UPDATE, "DELETE": OP_DELETE}
_CONTROL_OPS = frozenset(
    {"BEGIN", "COMMIT", "ROLLBACK", "ABORT", "HEARTBEAT", "CHECKPOINT", "COMMAND", "FILL",
     "FINISH", "CONTROL", "RDB", "NOOP", "INIT"}
)

_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)

# MySQL charset names -> Python codecs; None keeps the bytes (binary strings).
# MySQL's latin1 is really cp1252.
_CHARSETS: dict[str, str | None] = {
    "utf8mb4": "utf-8",
    "utf8mb3": "utf-8",
    "utf8": "utf-8",
    "latin1": "cp1252",
    "binary": None,
    "ucs2": "utf-16-be",
    "utf16": "utf-16-be",
    "utf16le": "utf-16-le",
    "utf32": "utf-32-be",
    "ujis": "euc-jp",
    "sjis": "shift_jis",
    "euckr": "euc-kr",
}

# MySQL column type numbers (the binlog's MYSQL_TYPE_*) -> canonical types. Decimals and
# the blob family are settled per value: precision/scale, or text vs binary.
_MYSQL_TYPE_NUMBERS = {
    1: "int", 2: "int", 3: "int", 9: "int", 13: "int",  # TINY SHORT LONG INT24 YEAR
    8: "bigint",
    4: "float",
    5: "double",
    7: "timestamp", 17: "timestamp", 12: "timestamp", 18: "timestamp",
    10: "date", 14: "date",
    15: "string", 253: "string", 254: "string", 247: "string", 248: "string",  # ENUM SET
    11: "string", 19: "string",  # TIME stays text: it can be negative or exceed 24 hours
    245: "json",
}

# Union branch -> canonical type, for non-MySQL sources and the blob family.
_KIND_TYPES = {
    "Integer": "bigint",
    "Character": "string",
    "Float": "double",
    "Timestamp": "timestamp",
    "DateTime": "timestamp",
    "TimestampWithTimeZone": "timestamp",
    "BinaryGeometry": "binary",
    "TextGeometry": "string",
    "BinaryObject": "binary",
    "TextObject": "string",
}


def _as_bytes(value: bytes | str) -> bytes:
    # The JSON form carries bytes as code points 0-255, as Avro's JSON encoding does.
    return value if type(value) is bytes else value.encode("latin-1")


def _characters(payload: dict[str, Any]) -> str | bytes:
    raw = _as_bytes(payload["value"])
    charset = payload["charset"].lower()
    codec = _CHARSETS.get(charset, charset)
    if codec is None:
        return raw
    try:
        codecs.lookup(codec)
    except LookupError:
        raise ValueError(f"unknown charset {payload['charset']!r}") from None
    return raw.decode(codec)


def _timestamp(payload: dict[str, Any]) -> datetime:
    # `millis` holds microseconds: Alibaba's own converters print it as six digits.
    return _EPOCH_UTC + timedelta(seconds=payload["timestamp"],
                                  microseconds=payload.get("millis") or 0)


def _date_time(payload: dict[str, Any]) -> date | datetime | int | str | None:
    """DateTime serves DATE, DATETIME, YEAR and TIME columns: the fields set tell which."""
    year, month, day = payload.get("year"), payload.get("month"), payload.get("day")
    hour, minute, second = payload.get("hour"), payload.get("minute"), payload.get("second")
    micros = payload.get("millis") or 0  # microseconds, as in Timestamp
    if year is None:
        # TIME can be negative or exceed 24 hours: text, as in every format (mysql_types).
        negative = min(hour or 0, minute or 0, second or 0, micros) < 0
        total = ((abs(hour or 0) * 60 + abs(minute or 0)) * 60 + abs(second or 0)) * 1_000_000
        total += abs(micros)
        return time_text(-total if negative else total)
    try:
        if hour is None and minute is None and second is None:
            if month is None and day is None:
                return year
            return date(year, month or 1, day or 1)
        return datetime(year, month, day, hour or 0, minute or 0, second or 0, micros)
    except ValueError:
        # MySQL zero dates (0000-00-00) have no calendar value.
        return None


def _zone(name: str) -> timezone | ZoneInfo:
    if name in ("Z", "UTC", "GMT"):
        return UTC
    if name[:1] in ("+", "-"):
        hours, _, minutes = name[1:].partition(":")
        offset = timedelta(hours=int(hours), minutes=int(minutes or 0))
        return timezone(-offset if name[0] == "-" else offset)
    return ZoneInfo(name)


def _timestamp_with_zone(payload: dict[str, Any]) -> datetime | None:
    local = _date_time(payload["value"])
    if not isinstance(local, datetime):
        return None
    return local.replace(tzinfo=_zone(payload["timezone"])).astimezone(UTC)


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "Integer": lambda payload: int(payload["value"]),
    "Character": _characters,
    "Decimal": lambda payload: Decimal(payload["value"]),
    "Float": lambda payload: float(payload["value"]),
    "Timestamp": _timestamp,
    "DateTime": _date_time,
    "TimestampWithTimeZone": _timestamp_with_zone,
    "BinaryGeometry": lambda payload: _as_bytes(payload["value"]),
    "TextGeometry": lambda payload: payload["value"],
    "BinaryObject": lambda payload: _as_bytes(payload["value"]),
    "TextObject": lambda payload: payload["value"],
    "EmptyObject": lambda payload: None,
}


def _column_type(type_number: int, kind: str, payload: Any, mysql: bool, value: Any
                 ) -> str | None:
    if kind == "Decimal":
        return f"decimal({payload['precision']},{payload['scale']})"
    if kind == "Character" and payload["charset"].lower() == "binary":
        return "binary"
    canonical = _MYSQL_TYPE_NUMBERS.get(type_number) if mysql else None
    canonical = canonical or _KIND_TYPES.get(kind)
    if kind == "Integer" and canonical in ("int", "bigint"):
        # A field's type number does not say UNSIGNED: an INT UNSIGNED above 2^31 or a
        # BIGINT UNSIGNED above 2^63 widens the column rather than failing its cast.
        return integer_type(value, canonical)
    return canonical


# Integer types in widening order: one record's images type a column by the wider.
_INTEGER_RANK = {"int": 0, "bigint": 1}


class DtsDecoder(ChangeDecoder):
    """Decodes Alibaba DTS Avro records (and the same record as JSON)."""

    name = "dts"

    def _decode(self, record: KafkaRecord) -> list[ChangeEvent]:
        value, topic, partition, offset, key, _headers = record
        record = self._json_record(value) if value[:1] == b"{" else self._avro_record(value)
        operation = record.get("operation")
        if type(operation) is not str:
            raise self._fail("missing or invalid field 'operation'")
        if operation in _CONTROL_OPS:
            return self._skip(f"dts:{operation}")
        op = _ROW_OPS.get(operation)
        if op is None and operation != "DDL":
            return self._skip(f"unknown_op:{operation}")

        position = self._position(record.get("sourcePosition"))
        seconds = record.get("sourceTimestamp")
        if type(seconds) is not int:
            raise self._fail("missing or invalid field 'sourceTimestamp' (seconds)")
        source_ts = seconds * 1000
        object_name = record.get("objectName")
        if object_name is not None and type(object_name) is not str:
            raise self._fail("field 'objectName' must be a string")
        database, _, table_name = (object_name or "").partition(".")
        if op is None:
            if not table_name:
                return self._skip("dts:ddl_without_table")
            return [ChangeEvent(f"{database}.{table_name}", OP_DDL, (), (), None, None,
                                position, source_ts, topic, partition, offset, 0,
                                self._ddl_statement(record))]
        table = self._table(database, table_name, "objectName", "objectName")

        fields = record.get("fields")
        if type(fields) is not list:
            raise self._fail(f"field 'fields' must be a list for {operation}")
        names = []
        for index, field in enumerate(fields):
            if type(field) is not dict or type(field.get("name")) is not str:
                raise self._fail(f"field 'fields[{index}].name' must be a string")
            names.append(field["name"])
        source = record.get("source")
        mysql = type(source) is dict and source.get("sourceType") == "MySQL"
        column_types: dict[str, str] = {}
        before = after = None
        if op != OP_CREATE:
            before = self._image(record, "beforeImages", fields, names, mysql, column_types)
        if op != OP_DELETE:
            after = self._image(record, "afterImages", fields, names, mysql, column_types)

        columns = self._key_columns(table, record.get("tags"))
        image, image_name = (before, "beforeImages") if op == OP_DELETE else (after, "afterImages")
        row_key = self._row_key(image, columns, image_name) if columns else ()
        event = ChangeEvent(table, op, row_key, columns, before, after, position, source_ts,
                            topic, partition, offset, 0, None, column_types or None)
        if op == OP_UPDATE and columns:
            old_key = self._row_key(before, columns, "beforeImages")
            if old_key != row_key:
                return split_key_change(event, old_key)
        return [event]

    def _avro_record(self, value: bytes) -> dict[str, Any]:
        try:
            return fastavro.schemaless_reader(
                io.BytesIO(value), RECORD_SCHEMA, None, return_record_name=True
            )
        except Exception as exc:  # fastavro signals bad input with many exception types
            message = f"value is not a DTS Avro Record: {type(exc).__name__}: {exc}"
            raise self._fail(message) from None

    def _json_record(self, value: bytes) -> dict[str, Any]:
        record = self._load_object(value)
        for images_name in ("beforeImages", "afterImages"):
            images = record.get(images_name)
            if type(images) is not list:
                continue
            for index, item in enumerate(images):
                if item is None:
                    continue
                if type(item) is not dict or len(item) != 1:
                    raise self._fail(
                        f"field '{images_name}[{index}]' must be null or a one-key object "
                        "naming its type"
                    )
                images[index] = next(iter(item.items()))
        return record

    def _position(self, source_position: Any) -> Position:
        if type(source_position) is not str:
            raise self._fail("missing or invalid field 'sourcePosition'")
        if "@" in source_position:
            parts = source_position.split("@")
            if all(part.isascii() and part.isdigit() for part in parts):
                return Position(file=int(parts[1]), pos=int(parts[0]))
        else:
            file_name, _, pos = source_position.rpartition(":")
            if file_name and pos.isascii() and pos.isdigit():
                return Position(file=self._binlog_index(file_name, "sourcePosition"),
                                pos=int(pos))
        raise self._fail(
            f"field 'sourcePosition' {source_position!r} is neither '<binlog file>:<offset>' "
            "nor '<offset>@<file index>'"
        )

    def _image(
        self,
        record: dict[str, Any],
        images_name: str,
        fields: list[dict[str, Any]],
        names: list[str],
        mysql: bool,
        column_types: dict[str, str],
    ) -> dict[str, Any]:
        images = record.get(images_name)
        if type(images) is not list:
            raise self._fail(f"field {images_name!r} must be a list of values")
        if len(images) != len(names):
            raise self._fail(
                f"field {images_name!r} has {len(images)} values for {len(names)} fields"
            )
        row: dict[str, Any] = {}
        for index, item in enumerate(images):
            if item is None:
                row[names[index]] = None
                continue
            type_name, payload = item
            kind = type_name.rpartition(".")[2]
            convert = _CONVERTERS.get(kind)
            if convert is None:
                raise self._fail(f"field '{images_name}[{index}]' has unknown type {type_name!r}")
            try:
                row[names[index]] = convert(payload)
                canonical = _column_type(fields[index].get("dataTypeNumber"), kind, payload,
                                         mysql, row[names[index]])
            except (KeyError, TypeError, ValueError, ArithmeticError, AttributeError) as exc:
                raise self._fail(
                    f"field '{images_name}[{index}]' ({kind}) is malformed: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            if canonical is not None:
                seen = column_types.get(names[index])
                if seen is None or _INTEGER_RANK.get(canonical, 2) > _INTEGER_RANK.get(seen, 2):
                    column_types[names[index]] = canonical
        return row

    def _key_columns(self, table: str, tags: Any) -> tuple[str, ...]:
        columns = self._key_override(table)
        if columns is not None:
            return columns
        info = tags.get("pk_uk_info") if type(tags) is dict else None
        if type(info) is not str:
            return ()
        try:
            primary = orjson.loads(info).get("PRIMARY")
        except (orjson.JSONDecodeError, AttributeError):
            # The tag is informational; a table without a usable one orders as keyless.
            return ()
        if type(primary) is list and all(type(column) is str for column in primary):
            return tuple(primary)
        return ()

    def _ddl_statement(self, record: dict[str, Any]) -> str:
        """The statement text of a DDL record."""
        ddl = record.get("afterImages")
        if type(ddl) is not str:
            ddl = record.get("beforeImages")
        if type(ddl) is not str:
            raise self._fail("DDL record carries no statement text in 'afterImages'")
        return ddl
