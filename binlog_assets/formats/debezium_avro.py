"""Debezium change events in Avro through a schema registry -> the same ChangeEvents as the
JSON path, typed by the same plans; an unknown schema id stops the partition unless
`binlake.unknown.schema.id` is `dead-letter`.

The wire format, the caches and the errors: docs/architecture.md, "Debezium in Avro".
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, time
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import orjson
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from fastavro import parse_schema, schemaless_reader

from binlog_assets.formats.base import KafkaRecord
from binlog_assets.formats.debezium import DebeziumDecoder, _build_plan, _RowPlan
from binlog_assets.formats.event import ChangeEvent, SourceUnavailableError, UnknownSchemaError
from binlog_assets.formats.mysql_types import time_text

_MAGIC = 0
_HEADER = struct.Struct(">bI")
# Far above the schemas a source's live tables use at once; a bound, not a tuning knob.
SCHEMA_CACHE_SIZE = 1024

# binlake's own key in the `schema_registry` settings (the others are the client's): what
# a record naming a schema id the registry does not know does.
UNKNOWN_SCHEMA_ID = "binlake.unknown.schema.id"
UNKNOWN_SCHEMA_ACTIONS = ("stop", "dead-letter")

# Avro primitive -> Connect type, unless the schema's `connect.type` says more (int8/16).
_CONNECT_TYPES = {"int": "int32", "long": "int64", "float": "float32", "double": "float64",
                  "boolean": "boolean", "string": "string", "bytes": "bytes"}


def _float32(value: float) -> float:
    # Avro holds a FLOAT as its 32 bits; the JSON converter writes the shortest text that
    # reads back to them (1.1, not 1.100000023841858), and so does numpy's float32.
    return float(str(np.float32(value)))


def _naive_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=None)


def _time_of_day(value: time) -> str:
    return time_text(((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
                     + value.microsecond)


def _identity(value: Any) -> Any:
    return value


# Values fastavro has already made Python values, by the Avro `logicalType`: converters
# from those to what the JSON path makes of the same column.
_AFTER_FASTAVRO: dict[str, Callable[[Any], Any]] = {
    "decimal": _identity,  # a Decimal of the schema's scale
    "date": _identity,
    "timestamp-millis": _naive_utc,
    "timestamp-micros": _naive_utc,
    "time-millis": _time_of_day,
    "time-micros": _time_of_day,
}


class _WriterSchema(NamedTuple):
    """One registered value schema: parsed for fastavro, and its row plan."""

    parsed: Any
    plan: _RowPlan | None


def _redacted(url: str) -> str:
    """`url` without user info, for messages (credentials may be written into it)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def registry_settings(conf: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The client's settings of `conf`, and whether records naming an unknown schema id
    are dead-lettered (`UNKNOWN_SCHEMA_ID`; default: the partition stops at them)."""
    client = dict(conf)
    action = client.pop(UNKNOWN_SCHEMA_ID, "stop")
    if action not in UNKNOWN_SCHEMA_ACTIONS:
        raise ValueError(f"`{UNKNOWN_SCHEMA_ID}` must be one of "
                         f"{', '.join(map(repr, UNKNOWN_SCHEMA_ACTIONS))}, got {action!r}")
    return client, action == "dead-letter"


def _branch(avro_type: Any) -> tuple[Any, bool]:
    """The non-null branch of an optional field's union, and whether it was optional."""
    if type(avro_type) is list:
        others = [t for t in avro_type if t != "null"]
        if len(others) != 1:
            raise ValueError(f"a union of {avro_type} is not an optional column")
        return others[0], len(others) < len(avro_type)
    return avro_type, False


def connect_fields(row: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The Connect row schema an Avro row record was made from (`_build_plan`'s input),
    and the Avro `logicalType` or primitive of each column whose value fastavro shapes."""
    fields: list[dict[str, Any]] = []
    avro_shapes: dict[str, str] = {}
    for field in row.get("fields") or ():
        column = field["name"]
        avro, optional = _branch(field["type"])
        spec = avro if type(avro) is dict else {"type": avro}
        primitive = spec.get("type")
        connect: dict[str, Any] = {
            "field": column, "optional": optional,
            "type": spec.get("connect.type") or _CONNECT_TYPES.get(primitive, "struct")}
        if "connect.name" in spec:
            connect["name"] = spec["connect.name"]
        if "connect.parameters" in spec:
            connect["parameters"] = spec["connect.parameters"]
        fields.append(connect)
        logical = spec.get("logicalType")
        if logical in _AFTER_FASTAVRO:
            avro_shapes[column] = logical
        elif primitive in ("bytes", "float"):
            avro_shapes[column] = primitive
    return fields, avro_shapes


def avro_row_plan(row: Mapping[str, Any]) -> _RowPlan:
    """The JSON path's plan for an Avro row record, its converters taking fastavro's values."""
    fields, shapes = connect_fields(row)
    plan = _build_plan(fields)
    converters = dict(plan.converters)
    for column, shape in shapes.items():
        if shape == "bytes":
            converters.pop(column, None)  # raw bytes already; the JSON path base64-decodes
        elif shape == "float":
            converters[column] = _float32
        else:
            converters[column] = _AFTER_FASTAVRO[shape]
    return plan._replace(converters=tuple(converters.items()), wide_decimals=())


def _row_record(envelope: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The row record of an envelope schema (its `after`, else `before`, field), with
    named references resolved against the records defined before them."""
    named: dict[str, Mapping[str, Any]] = {}
    row = None
    for field in envelope.get("fields") or ():
        avro, _ = _branch(field["type"])
        if type(avro) is dict and avro.get("type") == "record":
            name = str(avro.get("name", ""))
            namespace = avro.get("namespace") or envelope.get("namespace") or ""
            full = name if "." in name or not namespace else f"{namespace}.{name}"
            named[name.rsplit(".", 1)[-1]] = named[full] = avro
        elif type(avro) is str and avro in named:
            avro = named[avro]
        if field["name"] in ("before", "after") and type(avro) is dict:
            row = avro
            if field["name"] == "after":
                break
    return row


class DebeziumAvroDecoder(DebeziumDecoder):
    """Decodes Debezium records written by an Avro converter through a schema registry."""

    name = "debezium-avro"

    def __init__(
        self,
        key_columns: Mapping[str, Sequence[str]] | None = None,
        schema_registry: Mapping[str, Any] | None = None,
        *,
        client: SchemaRegistryClient | None = None,
    ) -> None:
        super().__init__(key_columns)
        conf, self.dead_letter_unknown = registry_settings(schema_registry or {})
        if client is None:
            if not conf.get("url"):
                raise ValueError("format 'debezium-avro' needs `schema_registry.url`")
            client = SchemaRegistryClient(conf)
        self._registry = client
        self._url = _redacted(str((schema_registry or {}).get("url", "the schema registry")))
        self._writers: dict[int, _WriterSchema] = {}
        self._key_names: dict[int, tuple[str, ...]] = {}
        self.cache_size = SCHEMA_CACHE_SIZE

    def _decode(self, record: KafkaRecord) -> list[ChangeEvent]:
        value = record[0]
        schema_id = self._schema_id(value, "value")
        writer = self._writers.get(schema_id)
        if writer is None:
            writer = self._writer_schema(schema_id)
            self._cache(self._writers, schema_id, writer)
        try:
            doc = schemaless_reader(io.BytesIO(value[_HEADER.size:]), writer.parsed, None)
        except (EOFError, ValueError, TypeError, struct.error) as exc:
            raise self._fail(f"value does not match its schema id {schema_id}: "
                             f"{type(exc).__name__}: {exc}") from None
        return self._events(doc, writer.plan, record)

    def _schema_id(self, data: bytes, what: str) -> int:
        if len(data) < _HEADER.size or data[0] != _MAGIC:
            first = f"0x{data[0]:02x}" if data else "nothing"
            raise self._fail(f"{what} is not in the schema registry's wire format: it starts "
                             f"with {first}, not the magic byte 0x00 and a schema id")
        return _HEADER.unpack_from(data)[1]

    def _fetch(self, schema_id: int) -> dict[str, Any]:
        try:
            schema = self._registry.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise UnknownSchemaError(
                    f"{self.name}: schema id {schema_id} is unknown to the schema registry "
                    f"at {self._url}: {exc.error_message}", schema_id, self._url,
                    dead_letter=self.dead_letter_unknown) from None
            raise SourceUnavailableError(
                f"{self.name}: the schema registry at {self._url} refused schema id "
                f"{schema_id}: HTTP {exc.http_status_code}: {exc.error_message}") from None
        except Exception as exc:  # the client's transport errors: the registry, not the record
            raise SourceUnavailableError(
                f"{self.name}: the schema registry at {self._url} cannot be reached: "
                f"{type(exc).__name__}: {exc}") from None
        if schema.schema_type not in (None, "AVRO"):
            raise self._fail(f"schema id {schema_id} is a {schema.schema_type} schema, not Avro")
        try:
            parsed = orjson.loads(schema.schema_str)
        except orjson.JSONDecodeError as exc:
            raise self._fail(f"schema id {schema_id} is not valid Avro JSON: {exc}") from None
        return parsed if type(parsed) is dict else {"type": parsed}

    def _writer_schema(self, schema_id: int) -> _WriterSchema:
        envelope = self._fetch(schema_id)
        try:
            parsed = parse_schema(envelope)
            row = _row_record(envelope)
            # Schema-change and transaction records carry no row.
            return _WriterSchema(parsed, None if row is None else avro_row_plan(row))
        except (KeyError, TypeError, ValueError) as exc:
            raise self._fail(f"schema id {schema_id} has a row record binlake cannot read: "
                             f"{type(exc).__name__}: {exc}") from None

    def _key_columns_of(self, table: str, key: bytes) -> tuple[str, ...]:
        if not key or key[0] != _MAGIC:
            return super()._key_columns_of(table, key)  # a JSON (or string) key converter
        schema_id = self._schema_id(key, "Kafka record key")
        names = self._key_names.get(schema_id)
        if names is None:
            record = self._fetch(schema_id)
            names = tuple(str(f["name"]) for f in record.get("fields") or ())
            if not names:
                raise self._fail(f"key schema id {schema_id} is not a record of key columns")
            self._cache(self._key_names, schema_id, names)
        return names

    def _cache(self, cache: dict[int, Any], schema_id: int, entry: Any) -> None:
        if len(cache) >= self.cache_size:
            del cache[next(iter(cache))]  # dicts keep insertion order: the oldest goes
        cache[schema_id] = entry


__all__ = ["DebeziumAvroDecoder", "avro_row_plan", "connect_fields"]
