from __future__ import annotations

import base64
import importlib.util
import io
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import fastavro
import orjson
import pytest

from binlog_assets.formats.dts import RECORD_SCHEMA, DtsDecoder
from binlog_assets.formats.event import DecodeError, Position

PRODUCTS = "inventory.products"
NS = "com.alibaba.dts.formats.avro."


def integer(value: int) -> tuple[str, dict]:
    return (NS + "Integer", {"precision": 11, "value": str(value)})


def chars(text: str, charset: str = "utf8mb4") -> tuple[str, dict]:
    return (NS + "Character", {"charset": charset, "value": text.encode("utf-8")})


def record(operation: str = "INSERT", **fields: Any) -> dict[str, Any]:
    doc = {
        "version": 0, "id": 1, "sourceTimestamp": 1596684883, "sourcePosition": "4567@123",
        "safeSourcePosition": "4000@123", "sourceTxid": "0",
        "source": {"sourceType": "MySQL", "version": "5.7.28"}, "operation": operation,
        "objectName": PRODUCTS, "processTimestamps": None, "tags": {},
        "fields": [{"name": "id", "dataTypeNumber": 3}, {"name": "name", "dataTypeNumber": 253}],
        "beforeImages": None, "afterImages": [integer(1), chars("a")],
    }
    doc.update(fields)
    return doc


def avro(doc: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, RECORD_SCHEMA, doc)
    return buffer.getvalue()


def as_json(doc: dict[str, Any]) -> bytes:
    def item(value: Any) -> Any:
        if not isinstance(value, tuple):
            return value
        name, payload = value
        if isinstance(payload, dict):
            payload = {k: v.decode("latin-1") if isinstance(v, bytes) else v
                       for k, v in payload.items()}
        return {name.removeprefix(NS): payload}

    out = dict(doc)
    for images in ("beforeImages", "afterImages"):
        if isinstance(doc.get(images), list):
            out[images] = [item(v) for v in doc[images]]
    return orjson.dumps(out)


def _fixture_events(fixtures_dir, decoder: DtsDecoder, name: str) -> list:
    events = []
    for offset, line in enumerate((fixtures_dir / "dts" / name).read_bytes().splitlines()):
        value = base64.b64decode(line) if name.endswith(".b64") else line
        events += decoder.decode(value, topic="dts", offset=offset)
    return events


@pytest.mark.parametrize("name", ["products.avro.b64", "products.jsonl"])
def test_fixture_ends_with_101_and_104_to_110_live(fixtures_dir, replay, name):
    decoder = DtsDecoder()
    events = _fixture_events(fixtures_dir, decoder, name)

    state = replay(events)
    assert set(state) == {(PRODUCTS, (i,)) for i in (101, *range(104, 111))}
    assert state[(PRODUCTS, (110,))] == {
        "id": 110, "name": "jacket", "description": "new water resistent white wind breaker",
        "weight": 0.5, "updated_at": datetime(2020, 8, 6, 3, 26, 0, 250000)}
    assert state[(PRODUCTS, (106,))]["description"] == "18oz carpenter hammer"
    assert state[(PRODUCTS, (101,))]["weight"] == 5.17
    assert decoder.skipped == {"dts:BEGIN": 10, "dts:COMMIT": 10, "dts:HEARTBEAT": 2}
    assert [e.op for e in events].count("ddl") == 1
    assert sorted(events, key=lambda e: e.sort_key()) == events
    assert events[0].column_types == {"id": "int", "name": "string", "description": "string",
                                      "weight": "float", "updated_at": "timestamp"}


def test_avro_and_json_fixtures_decode_alike(fixtures_dir):
    from_avro = _fixture_events(fixtures_dir, DtsDecoder(), "products.avro.b64")
    from_json = _fixture_events(fixtures_dir, DtsDecoder(), "products.jsonl")
    assert from_avro == from_json


def test_fixtures_match_their_generator(fixtures_dir, tmp_path):
    script = fixtures_dir / "dts" / "make_fixtures.py"
    spec = importlib.util.spec_from_file_location("make_dts_fixtures", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_fixtures(tmp_path)
    for name in ("products.avro.b64", "products.jsonl"):
        assert (tmp_path / name).read_bytes() == (fixtures_dir / "dts" / name).read_bytes()


@pytest.mark.parametrize("encode", [avro, as_json], ids=["avro", "json"])
def test_typed_union_values_are_unwrapped(encode):
    values = [
        ("i", 8, integer(-9007199254740993)),
        ("latin", 253, (NS + "Character", {"charset": "latin1", "value": "café".encode("cp1252")})),
        ("gbk", 253, (NS + "Character", {"charset": "gbk", "value": "中文".encode("gbk")})),
        ("varbin", 253, (NS + "Character", {"charset": "binary", "value": b"\x00\xff"})),
        ("dec", 246, (NS + "Decimal", {"value": "-1234.5600", "precision": 12, "scale": 4})),
        ("f", 5, (NS + "Float", {"value": 0.25, "precision": 22, "scale": -1})),
        ("ts", 17, (NS + "Timestamp", {"timestamp": 1589355606, "millis": 123456})),
        ("dt", 18, (NS + "DateTime", {"year": 2020, "month": 5, "day": 13, "hour": 9,
                                      "minute": 40, "second": 6, "millis": 500})),
        ("d", 10, (NS + "DateTime", {"year": 2020, "month": 2, "day": 29})),
        ("y", 13, (NS + "DateTime", {"year": 1999})),
        ("t", 19, (NS + "DateTime", {"hour": -838, "minute": -59, "second": -59})),
        ("zero", 12, (NS + "DateTime", {"year": 0, "month": 0, "day": 0, "hour": 0,
                                        "minute": 0, "second": 0})),
        ("tz", 17, (NS + "TimestampWithTimeZone", {
            "value": {"year": 2020, "month": 5, "day": 13, "hour": 17, "minute": 0,
                      "second": 0, "millis": None}, "timezone": "+08:00"})),
        ("blob", 252, (NS + "BinaryObject", {"type": "BLOB", "value": b"\x01\x02"})),
        ("text", 252, (NS + "TextObject", {"type": "TEXT", "value": "long text"})),
        ("js", 245, (NS + "TextObject", {"type": "JSON", "value": '{"a": 1}'})),
        ("geo", 255, (NS + "BinaryGeometry", {"type": "POINT", "value": b"\x00\x01"})),
        ("empty", 6, (NS + "EmptyObject", "NONE")),
        ("null", 3, None),
    ]
    doc = record(fields=[{"name": n, "dataTypeNumber": t} for n, t, _ in values],
                 afterImages=[v for _, _, v in values])
    [event] = DtsDecoder(key_columns={PRODUCTS: ["i"]}).decode(encode(doc))

    assert event.after == {
        "i": -9007199254740993, "latin": "café", "gbk": "中文", "varbin": b"\x00\xff",
        "dec": Decimal("-1234.5600"), "f": 0.25,
        "ts": datetime(2020, 5, 13, 7, 40, 6, 123456, tzinfo=UTC),
        "dt": datetime(2020, 5, 13, 9, 40, 6, 500), "d": date(2020, 2, 29), "y": 1999,
        "t": "-838:59:59", "zero": None, "tz": datetime(2020, 5, 13, 9, 0, tzinfo=UTC),
        "blob": b"\x01\x02", "text": "long text", "js": '{"a": 1}', "geo": b"\x00\x01",
        "empty": None, "null": None}
    assert event.column_types == {
        "i": "bigint", "latin": "string", "gbk": "string", "varbin": "binary",
        "dec": "decimal(12,4)", "f": "double", "ts": "timestamp", "dt": "timestamp",
        "d": "date", "y": "int", "t": "string", "zero": "timestamp", "tz": "timestamp",
        "blob": "binary", "text": "string", "js": "json", "geo": "binary"}
    assert event.key == (-9007199254740993,)
    assert event.source_ts == 1596684883000


@pytest.mark.parametrize("encode", [avro, as_json], ids=["avro", "json"])
def test_unsigned_integers_widen_their_column_instead_of_overflowing(encode):
    # A type number does not tell INT from INT UNSIGNED, nor BIGINT from BIGINT UNSIGNED.
    fields = [{"name": "id", "dataTypeNumber": 8}, {"name": "n", "dataTypeNumber": 3},
              {"name": "small", "dataTypeNumber": 3}]
    doc = record("UPDATE", fields=fields,
                 beforeImages=[integer(18446744073709551351), integer(4294967295), integer(1)],
                 afterImages=[integer(18446744073709551351), integer(7), integer(2)])
    [event] = DtsDecoder(key_columns={PRODUCTS: ["id"]}).decode(encode(doc))

    assert event.before == {"id": 18446744073709551351, "n": 4294967295, "small": 1}
    # The wider of the two images types the column.
    assert event.column_types == {"id": "decimal(20,0)", "n": "bigint", "small": "int"}


def test_latin1_bytes_are_decoded_as_mysql_latin1():
    # MySQL's latin1 is cp1252: 0x80 is the euro sign.
    doc = record(afterImages=[integer(1), (NS + "Character", {"charset": "latin1",
                                                               "value": b"\x80"})])
    assert DtsDecoder().decode(avro(doc))[0].after["name"] == "€"


def test_timestamp_with_named_zone():
    value = (NS + "TimestampWithTimeZone", {
        "value": {"year": 2020, "month": 7, "day": 1, "hour": 12, "minute": 0, "second": 0,
                  "millis": None}, "timezone": "Europe/Berlin"})
    doc = record(afterImages=[integer(1), value])
    after = DtsDecoder().decode(avro(doc))[0].after
    assert after["name"] == datetime(2020, 7, 1, 10, 0, tzinfo=UTC)
    assert after["name"].astimezone(timezone(timedelta(hours=2))).hour == 12


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("mysql-bin.000123:4567", Position(1, 123, 4567, 0)),
        ("4567@123", Position(1, 123, 4567, 0)),
        ("4567@123@1596684883", Position(1, 123, 4567, 0)),
    ],
)
def test_source_position_forms(text, position):
    [event] = DtsDecoder().decode(avro(record(sourcePosition=text)))
    assert event.position == position


def test_positions_compare_as_numbers_not_strings():
    def position(text: str) -> Position:
        return DtsDecoder().decode(avro(record(sourcePosition=text)))[0].position

    assert position("4@10") > position("999999@9")
    assert position("100000@9") > position("99999@9")
    assert position("mysql-bin.000010:4") > position("mysql-bin.000009:999999")


@pytest.mark.parametrize("text", ["", "4567", "abc@12", "12@", "mysql-bin:12", ":12",
                                  "mysql-bin.000001:", "mysql-bin.000001:x1"])
def test_unparseable_source_position_is_a_decode_error(text):
    with pytest.raises(DecodeError, match="'sourcePosition'"):
        DtsDecoder().decode(avro(record(sourcePosition=text)))


def test_key_columns_come_from_override_else_pk_tag():
    tags = {"pk_uk_info": '{"PRIMARY":["name"]}'}
    assert DtsDecoder().decode(avro(record(tags=tags)))[0].key == ("a",)
    assert DtsDecoder().decode(avro(record()))[0].key == ()
    assert DtsDecoder().decode(avro(record(tags={"pk_uk_info": "{bad"})))[0].key == ()
    overridden = DtsDecoder(key_columns={PRODUCTS: ["id"]}).decode(avro(record(tags=tags)))
    assert overridden[0].key == (1,)


def test_update_changing_the_primary_key_splits_into_delete_and_create():
    doc = record("UPDATE", beforeImages=[integer(1), chars("a")],
                 afterImages=[integer(2), chars("a")])
    delete, create = DtsDecoder(key_columns={PRODUCTS: ["id"]}).decode(avro(doc))
    assert (delete.op, delete.key, delete.row_index, delete.after) == ("d", (1,), 0, None)
    assert (create.op, create.key, create.row_index, create.before) == ("c", (2,), 1, None)
    [plain] = DtsDecoder().decode(avro(doc))
    assert plain.op == "u" and plain.before == {"id": 1, "name": "a"}


def test_delete_uses_the_before_image():
    doc = record("DELETE", beforeImages=[integer(1), chars("a")], afterImages=None)
    [event] = DtsDecoder(key_columns={PRODUCTS: ["id"]}).decode(avro(doc))
    assert (event.op, event.key, event.before, event.after) == (
        "d", (1,), {"id": 1, "name": "a"}, None)


def test_ddl_and_control_records():
    decoder = DtsDecoder()
    ddl = record("DDL", fields=None, afterImages="ALTER TABLE products ADD c INT")
    [event] = decoder.decode(avro(ddl))
    assert (event.op, event.table, event.ddl) == ("ddl", PRODUCTS, "ALTER TABLE products ADD c INT")

    assert decoder.decode(avro(record("DDL", objectName="inventory", fields=None,
                                      afterImages="CREATE DATABASE inventory"))) == []
    for operation in ("BEGIN", "COMMIT", "HEARTBEAT", "CHECKPOINT"):
        assert decoder.decode(avro(record(operation, objectName=None, fields=None,
                                          afterImages=None))) == []
    assert decoder.decode(None) == []
    assert decoder.decode(as_json(record("SHRUG"))) == []
    assert decoder.skipped == {"dts:ddl_without_table": 1, "dts:BEGIN": 1, "dts:COMMIT": 1,
                               "dts:HEARTBEAT": 1, "dts:CHECKPOINT": 1, "tombstone": 1,
                               "unknown_op:SHRUG": 1}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (b"{\"operation\": ", "JSON"),
        (b"\x02\x04", "Avro"),
        (as_json({k: v for k, v in record().items() if k != "operation"}), "'operation'"),
        (avro(record(objectName=None)), "'objectName'"),
        (avro(record(objectName="products")), "'objectName'"),
        (as_json(record(sourceTimestamp="1596684883")), "'sourceTimestamp'"),
        (as_json(record(sourcePosition=4567)), "'sourcePosition'"),
        (avro(record(afterImages=[integer(1)])), "'afterImages'"),
        (avro(record(fields=None)), "'fields'"),
        (as_json(record(afterImages=[{"Integer": {"value": "x1"}}, None])), "afterImages[0]"),
        (as_json(record(afterImages=[{"Bogus": {}}, None])), "afterImages[0]"),
        (as_json(record(afterImages=[1, None])), "afterImages[0]"),
        (avro(record(afterImages=[integer(1), chars("a", "klingon")])), "afterImages[1]"),
        (avro(record("DDL", fields=None, afterImages=None)), "'afterImages'"),
    ],
    ids=["invalid-json", "invalid-avro", "no-operation", "no-object-name", "no-table",
         "timestamp-string", "position-number", "images-misaligned", "fields-null",
         "integer-not-a-number", "unknown-union-type", "image-not-tagged", "unknown-charset",
         "ddl-without-text"],
)
def test_malformed_records_raise_decode_error_naming_the_field(value, field):
    with pytest.raises(DecodeError, match="^dts: ") as excinfo:
        DtsDecoder().decode(value)
    assert field in str(excinfo.value)
