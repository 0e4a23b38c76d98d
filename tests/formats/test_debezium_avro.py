"""Debezium through an Avro converter and a schema registry: the same ChangeEvents as JSON.

Each record here is written twice from one Connect schema and payload: as the JSON
converter writes it (schema block included) and as the Avro converter does (AvroData's
schema in the registry, the wire format in the record). Both decoders must give equal
events: columns, Python values and canonical types, positions, keys.

The registry is the real one (Apicurio, the session's `schema_registry`), reached as a
user configures it: Confluent's client at `http://…/apis/ccompat/v7`. The credential
test stays on `avro_wire.SchemaRegistry`, a fake: Apicurio 2.x authenticates through an
OIDC server, which does not run here.
"""

from __future__ import annotations

import base64
import time
from datetime import datetime
from decimal import Decimal
from typing import Any

import orjson
import pytest
from avro_wire import (
    CountingClient,
    RegistryWriter,
    SchemaRegistry,
    avro_value,
    connect_to_avro,
    envelope_schema,
    wire,
)

from binlog_assets.dev.process import free_port
from binlog_assets.dev.registry import SchemaRegistryServer
from binlog_assets.formats import make_decoder
from binlog_assets.formats.debezium import DebeziumDecoder
from binlog_assets.formats.debezium_avro import DebeziumAvroDecoder
from binlog_assets.formats.event import (
    OP_DDL,
    DecodeError,
    SourceUnavailableError,
    UnknownSchemaError,
)

TABLE = "shop.shop.orders"


def _b64_decimal(unscaled: int) -> str:
    raw = unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)
    return base64.b64encode(raw).decode()


def field(column: str, kind: str, optional: bool = True, **more: Any) -> dict[str, Any]:
    return {"field": column, "type": kind, "optional": optional, **more}


def _source_type(kind: str, length: int | None = None, scale: int | None = None) -> dict:
    parameters = {"__debezium.source.column.type": kind}
    if length is not None:
        parameters["__debezium.source.column.length"] = str(length)
    if scale is not None:
        parameters["__debezium.source.column.scale"] = str(scale)
    return parameters


DECIMAL = "org.apache.kafka.connect.data.Decimal"
# Every kind of column a MariaDB table gives Debezium, with the connector's defaults
# (time.precision.mode=adaptive_time_microseconds) and Connect's own logical types
# (time.precision.mode=connect) side by side.
ROW = [
    field("id", "int64", False),
    field("tiny", "int16"),
    field("small", "int16", parameters=_source_type("SMALLINT")),
    field("n", "int32"),
    field("un", "int64", parameters=_source_type("INT UNSIGNED", 10)),
    field("ubig", "bytes", name=DECIMAL,
          parameters={"scale": "0", **_source_type("BIGINT UNSIGNED", 20)}),
    field("price", "bytes", name=DECIMAL,
          parameters={"scale": "2", "connect.decimal.precision": "10"}),
    field("wide", "bytes", name=DECIMAL,
          parameters={"scale": "30", "connect.decimal.precision": "65"}),
    field("ratio", "float32"),
    field("score", "float64"),
    field("ok", "boolean"),
    field("note", "string"),
    field("blob", "bytes"),
    field("doc", "string", name="io.debezium.data.Json"),
    field("kind", "string", name="io.debezium.data.Enum", parameters={"allowed": "a,b"}),
    field("born", "int32", name="io.debezium.time.Date"),
    field("at", "int64", name="io.debezium.time.Timestamp"),
    field("at_us", "int64", name="io.debezium.time.MicroTimestamp"),
    field("zoned", "string", name="io.debezium.time.ZonedTimestamp"),
    field("clock", "int64", name="io.debezium.time.MicroTime"),
    field("year", "int32", name="io.debezium.time.Year"),
    field("c_date", "int32", name="org.apache.kafka.connect.data.Date"),
    field("c_time", "int32", name="org.apache.kafka.connect.data.Time"),
    field("c_ts", "int64", name="org.apache.kafka.connect.data.Timestamp"),
]
VALUES = {
    "id": 7, "tiny": -3, "small": 300, "n": -2_000_000_000, "un": 4_294_967_295,
    "ubig": _b64_decimal(18_446_744_073_709_551_351), "price": _b64_decimal(-123456),
    "wide": _b64_decimal(12345678901234567890123456789012345678901234567890),
    "ratio": 1.1, "score": 0.30000000000000004, "ok": True, "note": "héllo",
    "blob": base64.b64encode(b"\x00\xffab").decode(), "doc": '{"a": [1, 2]}', "kind": "b",
    "born": 18262, "at": 1589355606100, "at_us": 1589355606100123,
    "zoned": "2020-05-13T09:40:06.5+02:00", "clock": 45_296_000_001, "year": 2024,
    "c_date": -1, "c_time": 45_296_123, "c_ts": -1,
}


def source(pos: int, snapshot: str = "false") -> dict[str, Any]:
    return {"version": "3.4.0.Final", "connector": "mariadb", "name": "shop", "ts_ms": 17,
            "snapshot": snapshot, "db": "shop", "sequence": None, "table": "orders",
            "server_id": 1, "gtid": None, "file": "mysql-bin.000004", "pos": pos, "row": 0,
            "thread": None, "query": None}


KEY_SCHEMA = {"type": "struct", "name": f"{TABLE}.Key", "optional": False,
              "fields": [field("id", "int64", False)]}


class Both:
    """Writes each record as the JSON converter and as the Avro converter would."""

    def __init__(self, registry: RegistryWriter) -> None:
        self.registry = registry

    def records(self, row: list[dict[str, Any]], payload: dict[str, Any], key_id: int
                ) -> tuple[bytes, bytes, bytes, bytes]:
        schema = envelope_schema(TABLE, row)
        avro = connect_to_avro(schema)
        value_id = self.registry.register(avro)
        json_value = orjson.dumps({"schema": schema, "payload": payload})
        avro_record = wire(value_id, avro, avro_value(schema, payload))
        json_key = orjson.dumps({"id": key_id})
        key_avro = connect_to_avro(KEY_SCHEMA)
        avro_key = wire(self.registry.register(key_avro), key_avro, {"id": key_id})
        return json_value, avro_record, json_key, avro_key


@pytest.fixture
def registry(schema_registry: SchemaRegistryServer) -> RegistryWriter:
    return RegistryWriter(schema_registry.ccompat_url)


def _avro_decoder(registry: RegistryWriter) -> DebeziumAvroDecoder:
    decoder = make_decoder("debezium-avro", schema_registry={"url": registry.url})
    assert isinstance(decoder, DebeziumAvroDecoder)
    return decoder


def _counting_decoder(registry: RegistryWriter) -> tuple[DebeziumAvroDecoder, CountingClient]:
    conf = {"url": registry.url}
    client = CountingClient(conf)
    return DebeziumAvroDecoder(schema_registry=conf, client=client), client


def _events(decoder: Any, value: bytes, key: bytes, offset: int = 0) -> list:
    return decoder.decode(value, topic=TABLE, partition=0, offset=offset, key=key)


def test_every_column_kind_decodes_exactly_as_the_json_path(registry: RegistryWriter) -> None:
    both = Both(registry)
    json_dec, avro_dec = DebeziumDecoder(), _avro_decoder(registry)
    payloads = [
        {"before": None, "after": VALUES, "source": source(100), "op": "c", "ts_ms": 1},
        {"before": VALUES, "after": {**VALUES, "note": None, "ratio": -0.1, "blob": None},
         "source": source(200), "op": "u", "ts_ms": 2},
        {"before": VALUES, "after": None, "source": source(300), "op": "d", "ts_ms": 3},
        {"before": None, "after": {**VALUES, "id": 8}, "source": source(4, "true"),
         "op": "r", "ts_ms": 4},
    ]
    for offset, payload in enumerate(payloads):
        key_id = (payload["after"] or payload["before"])["id"]
        json_value, avro_record, json_key, avro_key = both.records(ROW, payload, key_id)
        expected = _events(json_dec, json_value, json_key, offset)
        got = _events(avro_dec, avro_record, avro_key, offset)
        assert got == expected
        for event, want in zip(got, expected, strict=True):
            for image, want_image in ((event.before, want.before), (event.after, want.after)):
                if want_image is not None:  # equal values of equal Python types
                    assert {c: type(v) for c, v in image.items()} == \
                           {c: type(v) for c, v in want_image.items()}
    first = _events(avro_dec, *both.records(ROW, payloads[0], 7)[1::2])[0]
    assert first.column_types == {
        "id": "bigint", "tiny": "int", "small": "int", "n": "int", "un": "bigint",
        "ubig": "decimal(20,0)", "price": "decimal(10,2)", "wide": "decimal(65,30)",
        "ratio": "float", "score": "double", "ok": "boolean", "note": "string",
        "blob": "binary", "doc": "json", "kind": "string", "born": "date",
        "at": "timestamp", "at_us": "timestamp", "zoned": "timestamp", "clock": "string",
        "year": "int", "c_date": "date", "c_time": "string", "c_ts": "timestamp"}
    assert first.after["ratio"] == 1.1 and first.after["clock"] == "12:34:56.000001"
    assert (first.key, first.key_columns) == ((7,), ("id",))


def test_an_added_column_is_followed_by_its_new_schema_id(registry: RegistryWriter) -> None:
    both = Both(registry)
    decoder, client = _counting_decoder(registry)
    narrow = [field("id", "int64", False), field("note", "string")]
    wide = [*narrow, field("price", "bytes", name=DECIMAL,
                           parameters={"scale": "2", "connect.decimal.precision": "8"})]
    old = both.records(narrow, {"before": None, "after": {"id": 1, "note": "a"},
                                "source": source(10), "op": "c"}, 1)
    new = both.records(wide, {"before": None, "after": {"id": 2, "note": "b",
                                                        "price": _b64_decimal(150)},
                              "source": source(20), "op": "c"}, 2)
    assert old[1][1:5] != new[1][1:5]  # two schema ids
    [first] = _events(decoder, old[1], old[3])
    [second] = _events(decoder, new[1], new[3], 1)
    [again] = _events(decoder, old[1], old[3], 2)  # a late record of the old schema
    assert first.column_types == {"id": "bigint", "note": "string"}
    assert second.column_types == {"id": "bigint", "note": "string", "price": "decimal(8,2)"}
    assert str(second.after["price"]) == "1.50"
    assert again.column_types == first.column_types
    # One fetch per schema id (value and key schemas), however many records.
    assert sorted(client.fetched) == sorted(registry.ids) and len(registry.ids) == 3


def test_the_schema_caches_are_bounded(registry: RegistryWriter) -> None:
    both = Both(registry)
    decoder, client = _counting_decoder(registry)
    decoder.cache_size = 2
    rows = [[field("id", "int64", False), field(f"c{i}", "int32")] for i in range(3)]
    records = [both.records(row, {"before": None, "after": {"id": i, f"c{i}": i},
                                  "source": source(i), "op": "c"}, i)
               for i, row in enumerate(rows)]
    value_ids = [int.from_bytes(r[1][1:5], "big") for r in records]
    events = [_events(decoder, r[1], r[3], i) for i, r in enumerate([*records, records[0]])]
    assert [e.after for [e] in events] == [{"id": i, f"c{i}": i} for i in (0, 1, 2, 0)]
    # The first schema was dropped for the third and fetched again; the key's stayed.
    assert [i for i in client.fetched if i in value_ids] == [*value_ids, value_ids[0]]
    assert len(client.fetched) == 5


def test_a_json_key_with_an_avro_value_is_read_as_json(registry: RegistryWriter) -> None:
    _, avro_record, json_key, _ = Both(registry).records(
        ROW[:1], {"before": None, "after": {"id": 3}, "source": source(1), "op": "c"}, 3)
    [event] = _events(_avro_decoder(registry), avro_record, json_key)
    assert (event.key, event.key_columns) == ((3,), ("id",))


def test_schema_change_records_become_ddl_events(registry: RegistryWriter) -> None:
    # The schema-change topic's value schema, written in Avro directly (arrays of records).
    avro = {"type": "record", "name": "SchemaChangeValue",
            "namespace": "io.debezium.connector.mariadb", "fields": [
                {"name": "source", "type": connect_to_avro(
                    {**envelope_schema(TABLE, [])["fields"][2]})},
                {"name": "ts_ms", "type": "long"},
                {"name": "databaseName", "type": ["null", "string"], "default": None},
                {"name": "ddl", "type": ["null", "string"], "default": None},
                {"name": "tableChanges", "type": {"type": "array", "items": {
                    "type": "record", "name": "Change", "fields": [
                        {"name": "type", "type": "string"},
                        {"name": "id", "type": "string"},
                        {"name": "table", "type": ["null", {
                            "type": "record", "name": "Table", "fields": [
                                {"name": "primaryKeyColumnNames",
                                 "type": ["null", {"type": "array", "items": "string"}]},
                                {"name": "columns", "type": {"type": "array", "items": {
                                    "type": "record", "name": "Column", "fields": [
                                        {"name": "name", "type": "string"},
                                        {"name": "typeName", "type": "string"},
                                        {"name": "length", "type": ["null", "int"]},
                                        {"name": "scale", "type": ["null", "int"]}]}}}]}]}]}}}]}
    value = {"source": source(50), "ts_ms": 5, "databaseName": "shop",
             "ddl": "ALTER TABLE orders ADD COLUMN note VARCHAR(20)",
             "tableChanges": [{"type": "ALTER", "id": '"shop"."orders"', "table": {
                 "primaryKeyColumnNames": ["id"], "columns": [
                     {"name": "id", "typeName": "BIGINT", "length": None, "scale": None},
                     {"name": "note", "typeName": "VARCHAR", "length": 20, "scale": None}]}}]}
    record = wire(registry.register(avro), avro, value)
    [ddl] = _avro_decoder(registry).decode(record, topic="shop", partition=0, offset=9)
    json_events = DebeziumDecoder().decode(orjson.dumps(value), topic="shop", offset=9)
    assert ddl.op == OP_DDL and [ddl] == json_events


def test_a_record_not_in_the_wire_format_is_a_decode_error(registry: RegistryWriter) -> None:
    decoder, client = _counting_decoder(registry)
    with pytest.raises(DecodeError, match="not in the schema registry's wire format: it "
                                          "starts with 0x7b, not the magic byte 0x00"):
        decoder.decode(b'{"op": "c"}', topic=TABLE, offset=1)
    with pytest.raises(DecodeError, match="starts with 0x00"):
        decoder.decode(b"\x00\x00", topic=TABLE, offset=2)  # too short for an id
    assert client.fetched == []


def test_an_unknown_schema_id_is_a_decode_error_naming_it(registry: RegistryWriter) -> None:
    with pytest.raises(UnknownSchemaError, match=r"schema id 4242 is unknown to the schema "
                                                 r"registry at http://127\.0\.0\.1:\d+/apis/"
                                                 r"ccompat/v7: No content with id/hash "
                                                 r"'contentId-4242'") as unknown:
        _avro_decoder(registry).decode(b"\x00\x00\x00\x10\x92rest", topic=TABLE)
    # By default the run stops the partition at such a record; the setting dead-letters it.
    assert (unknown.value.schema_id, unknown.value.registry) == (4242, registry.url)
    assert unknown.value.dead_letter is False
    decoder = make_decoder("debezium-avro", schema_registry={
        "url": registry.url, "binlake.unknown.schema.id": "dead-letter"})
    with pytest.raises(UnknownSchemaError) as unknown:
        decoder.decode(b"\x00\x00\x00\x10\x92rest", topic=TABLE)
    assert unknown.value.dead_letter is True


def test_a_record_that_does_not_match_its_schema_is_a_decode_error(
        registry: RegistryWriter) -> None:
    _, avro_record, _, avro_key = Both(registry).records(
        ROW[:2], {"before": None, "after": {"id": 1, "tiny": 2}, "source": source(1),
                  "op": "c"}, 1)
    schema_id = int.from_bytes(avro_record[1:5], "big")
    with pytest.raises(DecodeError, match=f"does not match its schema id {schema_id}: "):
        _avro_decoder(registry).decode(avro_record[:12], topic=TABLE, key=avro_key)


def test_an_unreachable_registry_fails_at_once_instead_of_dead_lettering() -> None:
    url = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"  # nothing listens there
    decoder = make_decoder("debezium-avro", schema_registry={
        "url": url, "max.retries": 1, "retries.wait.ms": 10})
    began = time.monotonic()
    with pytest.raises(SourceUnavailableError, match=f"the schema registry at {url} cannot "
                                                     f"be reached: ConnectError"):
        decoder.decode(b"\x00\x00\x00\x00\x01rest", topic=TABLE)
    assert time.monotonic() - began < 5


def test_refused_credentials_fail_at_once_and_never_show_the_password() -> None:
    secret = "s3cret-registry-password"
    with SchemaRegistry(user_info=f"binlake:{secret}") as registry:
        url_with_secret = registry.url.replace("http://", f"http://binlake:{secret}x@")
        for conf in ({"url": registry.url, "basic.auth.user.info": f"binlake:{secret}x"},
                     {"url": url_with_secret}):
            decoder = make_decoder("debezium-avro", schema_registry=conf)
            with pytest.raises(SourceUnavailableError, match="refused schema id 1: HTTP 401") \
                    as refused:
                decoder.decode(b"\x00\x00\x00\x00\x01rest", topic=TABLE)
            assert secret not in str(refused.value)
        # The right password is let in.
        avro = connect_to_avro(envelope_schema(TABLE, ROW[:1]))
        record = wire(registry.register(avro), avro, avro_value(
            envelope_schema(TABLE, ROW[:1]), {"before": None, "after": {"id": 5},
                                              "source": source(3), "op": "c"}))
        decoder = make_decoder("debezium-avro", schema_registry={
            "url": registry.url, "basic.auth.user.info": f"binlake:{secret}"})
        [event] = decoder.decode(record, topic=TABLE, key=orjson.dumps({"id": 5}))
        assert event.after == {"id": 5}


def test_the_format_needs_a_registry_url() -> None:
    with pytest.raises(ValueError, match="needs `schema_registry.url`"):
        make_decoder("debezium-avro")


# An envelope schema as registries hold them (the shape of public captures of Debezium's
# Avro converter): the row record named `Value` without a namespace (it takes the
# envelope's), `after` a reference to it, NOT NULL columns with defaults, and optional
# columns whose union puts "null" second when the column has a non-null default.
REGISTERED = """{"type":"record","name":"Envelope","namespace":"shop.shop.tickets",
"fields":[{"name":"before","type":["null",{"type":"record","name":"Value","fields":[
 {"name":"id","type":"long"},
 {"name":"title","type":{"type":"string","connect.default":"none"},"default":"none"},
 {"name":"prio","type":[{"type":"int","connect.type":"int16","connect.default":9},"null"],
  "default":9},
 {"name":"opened","type":{"type":"long","connect.version":1,"connect.default":0,
  "connect.parameters":{"__debezium.source.column.type":"DATETIME"},
  "connect.name":"io.debezium.time.Timestamp"},"default":0},
 {"name":"cost","type":["null",{"type":"bytes","scale":2,"precision":8,
  "connect.version":1,"connect.parameters":{"scale":"2",
  "connect.decimal.precision":"8"},"connect.name":"org.apache.kafka.connect.data.Decimal",
  "logicalType":"decimal"}],"default":null}],
 "connect.name":"shop.shop.tickets.Value"}],"default":null},
{"name":"after","type":["null","Value"],"default":null},
{"name":"source","type":{"type":"record","name":"Source","namespace":"io.debezium.connector.mariadb",
 "fields":[{"name":"version","type":"string"},{"name":"connector","type":"string"},
 {"name":"name","type":"string"},{"name":"ts_ms","type":"long"},
 {"name":"snapshot","type":[{"type":"string","connect.version":1,
  "connect.parameters":{"allowed":"true,last,false,incremental"},"connect.default":"false",
  "connect.name":"io.debezium.data.Enum"},"null"],"default":"false"},
 {"name":"db","type":"string"},{"name":"table","type":["null","string"],"default":null},
 {"name":"server_id","type":"long"},{"name":"file","type":"string"},
 {"name":"pos","type":"long"},{"name":"row","type":"int"}],
 "connect.name":"io.debezium.connector.mariadb.Source"}},
{"name":"op","type":"string"},{"name":"ts_ms","type":["null","long"],"default":null}],
"connect.name":"shop.shop.tickets.Envelope"}"""


def test_a_schema_in_the_registry_s_own_shape_decodes(registry: RegistryWriter) -> None:
    schema = orjson.loads(REGISTERED)
    value = {"before": None, "op": "c", "ts_ms": 5,
             "after": {"id": 4, "title": "late", "prio": None, "opened": 1589355606100,
                       "cost": Decimal("12.50")},
             "source": {"version": "3.4.0.Final", "connector": "mariadb", "name": "shop",
                        "ts_ms": 5, "snapshot": "false", "db": "shop", "table": "tickets",
                        "server_id": 1, "file": "mysql-bin.000002", "pos": 77, "row": 1}}
    record = wire(registry.register(schema), schema, value)
    [event] = _avro_decoder(registry).decode(record, topic="shop.shop.tickets", offset=3,
                                             key=orjson.dumps({"id": 4}))
    assert (event.table, event.op, event.key, event.position.pos) == \
        ("shop.tickets", "c", (4,), 77)
    assert event.after == {"id": 4, "title": "late", "prio": None,
                           "opened": datetime(2020, 5, 13, 7, 40, 6, 100000),
                           "cost": Decimal("12.50")}
    assert event.column_types == {"id": "bigint", "title": "string", "prio": "int",
                                  "opened": "timestamp", "cost": "decimal(8,2)"}
