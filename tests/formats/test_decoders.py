"""The decoder registry, the interface every decoder shares, and robustness to bad input."""

from __future__ import annotations

import inspect
from collections import Counter
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from binlog_assets.consume.slot_routing import ORDERING_KEY, table_slots
from binlog_assets.formats import (
    DECODERS,
    CanalDecoder,
    DebeziumDecoder,
    DtsDecoder,
    MaxwellDecoder,
    make_decoder,
)
from binlog_assets.formats.event import (
    OP_CREATE,
    OP_DDL,
    OP_DELETE,
    OP_READ,
    OP_TRUNCATE,
    OP_UPDATE,
    ChangeEvent,
    DecodeError,
)

OPS = frozenset({OP_CREATE, OP_UPDATE, OP_DELETE, OP_READ, OP_TRUNCATE, OP_DDL})


def test_registry_names_every_decoder():
    expected = {"debezium": DebeziumDecoder, "maxwell": MaxwellDecoder,
                "canal": CanalDecoder, "dts": DtsDecoder}
    assert expected == DECODERS
    for name, decoder_class in DECODERS.items():
        decoder = make_decoder(name)
        assert type(decoder) is decoder_class and decoder.name == name
        assert decoder.skipped == Counter()


def test_make_decoder_passes_key_columns():
    decoder = make_decoder("maxwell", key_columns={"test.product": ["name"]})
    value = b'{"database":"test","table":"product","type":"insert","data":{"id":1,"name":"a"}}'
    assert decoder.decode(value)[0].key == ("a",)


def test_key_columns_must_be_lists_of_names():
    with pytest.raises(ValueError, match="key_columns\\['d.t'\\]"):
        make_decoder("canal", key_columns={"d.t": "id"})


def test_unknown_format_names_the_known_ones():
    with pytest.raises(ValueError,
                       match="'avro-magic'.*canal, debezium, debezium-avro, dts, maxwell"):
        make_decoder("avro-magic")


@pytest.mark.parametrize("decoder_class", DECODERS.values())
def test_decode_signature(decoder_class):
    parameters = inspect.signature(decoder_class.decode).parameters
    assert list(parameters) == ["self", "value", "topic", "partition", "offset", "key",
                                "headers"]
    assert all(parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
               for name in ("topic", "partition", "offset", "key", "headers"))


def _time_records(micros: int, text: str) -> dict[str, tuple[str, bytes]]:
    """One row with TIME column `t` = `micros` (`text` as MySQL writes it): per way of
    sending it, the format and the record."""
    source = {"db": "d", "table": "t", "file": "mysql-bin.000001", "pos": 4, "row": 0}

    def debezium(name: str, value: int) -> tuple[str, bytes]:
        row = {"type": "struct", "field": "after", "fields": [
            {"field": "id", "type": "int32"}, {"field": "t", "type": "int64", "name": name}]}
        return "debezium", orjson.dumps({
            "schema": {"type": "struct", "fields": [row]},
            "payload": {"before": None, "after": {"id": 1, "t": value}, "op": "c",
                        "source": source}})

    negative = micros < 0
    seconds, fraction = divmod(abs(micros), 1_000_000)
    sign = -1 if negative else 1
    clock = {"hour": sign * (seconds // 3600), "minute": sign * (seconds // 60 % 60),
             "second": sign * (seconds % 60), "millis": sign * fraction}
    records = {
        "debezium MicroTime": debezium("io.debezium.time.MicroTime", micros),
        "debezium NanoTime": debezium("io.debezium.time.NanoTime", micros * 1000),
        "canal": ("canal", orjson.dumps({
            "data": [{"id": "1", "t": text}], "database": "d", "table": "t", "isDdl": False,
            "mysqlType": {"id": "int(11)", "t": "time(6)"}, "pkNames": ["id"],
            "type": "INSERT"})),
        "dts": ("dts", orjson.dumps({
            "version": 0, "id": 1, "sourceTimestamp": 1, "sourcePosition": "4@1",
            "source": {"sourceType": "MySQL", "version": "8.0"}, "operation": "INSERT",
            "objectName": "d.t", "tags": {}, "beforeImages": None,
            "fields": [{"name": "id", "dataTypeNumber": 3}, {"name": "t", "dataTypeNumber": 19}],
            "afterImages": [{"Integer": {"precision": 11, "value": "1"}},
                            {"DateTime": clock}]})),
    }
    if fraction % 1000 == 0:  # TIME(0-3) under time.precision.mode=adaptive or connect
        records["debezium Time"] = debezium("io.debezium.time.Time", micros // 1000)
        records["connect Time"] = debezium("org.apache.kafka.connect.data.Time", micros // 1000)
    return records


@pytest.mark.parametrize(
    ("micros", "text", "expected"),
    [(45_296_789_000, "12:34:56.789", "12:34:56.789000"),
     (-3_020_399_000_000, "-838:59:59", "-838:59:59"),
     (-500_000, "-00:00:00.500000", "-00:00:00.500000"),
     (1, "00:00:00.000001", "00:00:00.000001"),
     (0, "00:00:00.000", "00:00:00")])
def test_a_time_is_the_same_text_in_every_format(micros, text, expected):
    records = _time_records(micros, text)
    decoded = {}
    for name, (format_name, value) in records.items():
        [event] = make_decoder(format_name).decode(value)
        decoded[name] = (event.after["t"], event.column_types["t"])
    assert decoded == {name: (expected, "string") for name in records}


# Valid records of each format; the property tests below corrupt parts of them.
BASES: dict[str, list[dict[str, Any]]] = {
    "debezium": [
        {"before": {"id": 1}, "after": {"id": 2}, "op": "u", "ts_ms": 5,
         "source": {"db": "d", "table": "t", "file": "mysql-bin.000001", "pos": 4, "row": 0,
                    "snapshot": "false", "ts_ms": 1}},
        {"schema": {"type": "struct", "fields": [
            {"field": "after", "type": "struct", "fields": [
                {"field": "id", "type": "int32"},
                {"field": "p", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                 "parameters": {"scale": "2"}}]}]},
         "payload": {"after": {"id": 1, "p": "AQ=="}, "op": "c",
                     "source": {"db": "d", "table": "t", "file": "mysql-bin.000001"}}},
        {"source": {"db": "d", "file": "mysql-bin.000001", "pos": 4}, "databaseName": "d",
         "ddl": "ALTER TABLE t ADD c INT", "tableChanges": [
             {"id": '"d"."t"', "table": {"primaryKeyColumnNames": ["id"], "columns": [
                 {"name": "id", "typeName": "INT"}]}}]},
    ],
    "maxwell": [
        {"database": "d", "table": "t", "type": "update", "ts": 1, "xoffset": 0,
         "position": "master.000001:4", "data": {"id": 2}, "old": {"id": 1},
         "primary_key_columns": ["id"]},
        {"database": "d", "table": "t", "type": "table-create", "sql": "CREATE TABLE t (i INT)",
         "def": {"primary-key": ["i"], "columns": [{"type": "int", "name": "i"}]}},
    ],
    "canal": [
        {"data": [{"id": "2", "d": "2020-01-01"}], "old": [{"id": "1"}], "database": "d",
         "table": "t", "type": "UPDATE", "isDdl": False, "es": 1, "pkNames": ["id"],
         "mysqlType": {"id": "int(11)", "d": "date"}},
        {"data": None, "database": "d", "table": "t", "type": "ALTER", "isDdl": True,
         "sql": "ALTER TABLE t ADD c INT", "es": 1},
    ],
    "dts": [
        {"version": 0, "id": 1, "sourceTimestamp": 1, "sourcePosition": "4@1",
         "safeSourcePosition": "", "sourceTxid": "", "operation": "UPDATE",
         "source": {"sourceType": "MySQL", "version": "8"}, "objectName": "d.t",
         "tags": {"pk_uk_info": '{"PRIMARY":["id"]}'},
         "fields": [{"name": "id", "dataTypeNumber": 3}],
         "beforeImages": [{"Integer": {"precision": 4, "value": "1"}}],
         "afterImages": [{"Integer": {"precision": 4, "value": "2"}}]},
    ],
}

FIELD_NAMES = sorted({name for bases in BASES.values() for base in bases for name in base}
                     | {"db", "table", "file", "pos", "row", "snapshot", "id", "value",
                        "precision", "charset", "Integer", "Character", "timestamp"})
LEAVES = st.sampled_from(["c", "u", "d", "r", "t", "insert", "UPDATE", "DDL", "BEGIN",
                          "mysql-bin.000002", "master.000002:7", "7@2", "AQ==", "2020-13-01",
                          "int(11)", '"d"."t"', "{"])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=6) | LEAVES,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(FIELD_NAMES), children, max_size=3),
    max_leaves=8,
)


def _corrupt(base: Any, overrides: dict[str, Any], inner: dict[str, Any], depth: int) -> Any:
    """Overlay `overrides` on the top level and `inner` on every nested object."""
    if isinstance(base, dict):
        out = {k: _corrupt(v, inner, inner, depth + 1) for k, v in base.items()}
        out.update(overrides if depth == 0 else inner)
        return out
    if isinstance(base, list):
        return [_corrupt(v, inner, inner, depth + 1) for v in base]
    return base


def slot_of(event: ChangeEvent, slots: int = 8) -> int:
    """The key slot the dispatcher's key ordering routes `event` to, which every decoded
    event must have."""
    return table_slots(event, ORDERING_KEY, slots).slot(event.key, slots)


def _decode_is_total(name: str, value: bytes) -> None:
    """Decoding yields valid events that the lanes can route, or a DecodeError that names
    what is wrong (the run dead-letters it): nothing else escapes to stop a partition.

    The base class turns any unforeseen exception into a generic "malformed record"
    DecodeError; reaching it means a check that names the field is missing.
    """
    decoder = make_decoder(name, key_columns={"d.x": ["id"]})
    try:
        events = decoder.decode(value, key=b'{"id": 1}' if name == "debezium" else None)
    except DecodeError as exc:
        assert str(exc).startswith(f"{name}: ")
        assert "malformed record:" not in str(exc)
        return
    assert all(isinstance(e, ChangeEvent) and e.op in OPS for e in events)
    for event in events:
        slot_of(event)


@pytest.mark.parametrize(("name", "record", "message"), [
    ("debezium", {"before": None, "after": {"id": [1]}, "op": "c",
                  "source": {"db": "d", "table": "t", "file": "mysql-bin.000001", "pos": 4}},
     "key column 'id' of 'after' holds a list"),
    ("maxwell", {"database": "d", "table": "t", "type": "insert", "data": {"id": {"a": 1}},
                 "primary_key_columns": ["id"]}, "key column 'id' of 'data' holds a dict"),
    # Canal's values are text: a list is refused with the other non-strings.
    ("canal", {"data": [{"id": ["1"]}], "database": "d", "table": "t", "type": "INSERT",
               "isDdl": False, "es": 1, "pkNames": ["id"], "mysqlType": {"id": "int(11)"}},
     r"field 'data\[0\].id' must be a string or null"),
])
def test_a_key_value_that_is_an_array_or_object_is_a_decode_error(name, record, message):
    # Decoded, it would stop the run in the lanes (unhashable), at every rerun.
    with pytest.raises(DecodeError, match=message):
        make_decoder(name).decode(orjson.dumps(record), key=b'{"id": 1}')


@pytest.mark.parametrize("name", sorted(BASES))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_corrupted_records_decode_or_raise_decode_error(name, data):
    base = data.draw(st.sampled_from(BASES[name]))
    overrides = data.draw(st.dictionaries(st.sampled_from(FIELD_NAMES), JSON_VALUES, max_size=3))
    inner = data.draw(st.dictionaries(st.sampled_from(FIELD_NAMES), JSON_VALUES, max_size=2))
    _decode_is_total(name, orjson.dumps(_corrupt(base, overrides, inner, 0)))


@pytest.mark.parametrize("name", sorted(BASES))
@settings(max_examples=100, deadline=None)
@given(value=st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_decode_error(name, value):
    _decode_is_total(name, value)


def _keyless_insert() -> dict[str, bytes]:
    """An insert into `shop_1.logs`, a table without a primary key, as each format sends
    it: no key fields, and (Debezium, Maxwell) a null Kafka record key."""
    row = {"level": "info", "msg": "start"}
    return {
        "debezium": orjson.dumps({
            "before": None, "after": row, "op": "c",
            "source": {"db": "shop_1", "table": "logs", "file": "mysql-bin.000001",
                       "pos": 4, "row": 0}}),
        "maxwell": orjson.dumps({"database": "shop_1", "table": "logs", "type": "insert",
                                 "data": row}),
        "canal": orjson.dumps({
            "data": [row], "database": "shop_1", "table": "logs", "isDdl": False,
            "mysqlType": {"level": "varchar(10)", "msg": "varchar(100)"}, "pkNames": None,
            "type": "INSERT"}),
        "dts": orjson.dumps({
            "version": 0, "id": 1, "sourceTimestamp": 1, "sourcePosition": "4@1",
            "source": {"sourceType": "MySQL", "version": "8.0"}, "operation": "INSERT",
            "objectName": "shop_1.logs", "tags": {}, "beforeImages": None,
            "fields": [{"name": "level", "dataTypeNumber": 253},
                       {"name": "msg", "dataTypeNumber": 253}],
            "afterImages": [{"Character": {"charset": "utf8", "value": "info"}},
                            {"Character": {"charset": "utf8", "value": "start"}}]}),
    }


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_a_change_of_a_keyless_table_has_no_key_and_orders_by_its_table(name):
    value = _keyless_insert()[name]
    [event] = make_decoder(name).decode(value, key=None)
    assert (event.table, event.key, event.key_columns) == ("shop_1.logs", (), ())
    # The lanes keep a keyless table's events in order on its table's lane.
    truncate = ChangeEvent("shop_1.logs", "t", (), (), None, None, event.position, None)
    assert slot_of(event) == slot_of(truncate)


@pytest.mark.parametrize("name", sorted(DECODERS))
@pytest.mark.parametrize("table", ["shop_1.logs", r"shop_\d+\.logs"])
def test_key_columns_from_the_config_key_a_keyless_table(name, table):
    # A table config's source may be a regex over sharded tables: the key applies to each.
    [event] = make_decoder(name, key_columns={table: ["msg"]}).decode(
        _keyless_insert()[name], key=None)
    assert (event.key, event.key_columns) == (("start",), ("msg",))
