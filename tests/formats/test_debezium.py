from __future__ import annotations

import base64
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import orjson
import pytest

from binlog_assets.formats.debezium import DebeziumDecoder
from binlog_assets.formats.event import (
    SNAPSHOT_END_ROW,
    SNAPSHOT_ROW,
    SNAPSHOT_SCHEMA_ROW,
    DecodeError,
    Position,
)

PRODUCTS = "inventory.products"
FIXTURE = "debezium-data-schema-include.txt"


def envelope(op: str = "c", before: Any = None, after: Any = None, **source: Any) -> dict:
    src = {"version": "2.7.0.Final", "connector": "mysql", "name": "dbserver1",
           "ts_ms": 1700000000000, "snapshot": "false", "db": "inventory",
           "table": "products", "server_id": 223344, "file": "mysql-bin.000003",
           "pos": 154, "row": 0}
    src.update(source)
    return {"before": before, "after": after, "source": src, "op": op,
            "ts_ms": 1700000000123, "transaction": None}


def encode(doc: Any) -> bytes:
    return orjson.dumps(doc)


def test_schema_include_fixture_ends_with_101_to_110_live(flink_lines, decode_lines, replay):
    decoder = DebeziumDecoder(key_columns={PRODUCTS: ["id"]})
    events = decode_lines(decoder, flink_lines(FIXTURE))

    state = replay(events)
    assert set(state) == {(PRODUCTS, (i,)) for i in range(101, 111)}
    assert state[(PRODUCTS, (106,))] == {
        "id": 106, "name": "hammer", "description": "18oz carpenter hammer", "weight": 1.0}
    assert state[(PRODUCTS, (107,))]["weight"] == 5.099999904632568
    assert state[(PRODUCTS, (110,))] == {
        "id": 110, "name": "jacket", "description": "new water resistent white wind breaker",
        "weight": 0.5}
    assert state[(PRODUCTS, (101,))]["weight"] == 3.140000104904175
    assert not decoder.skipped


def test_schema_include_fixture_positions_types_and_order(flink_lines, decode_lines):
    events = decode_lines(DebeziumDecoder(key_columns={PRODUCTS: ["id"]}),
                          flink_lines(FIXTURE))

    assert [e.position.snapshot for e in events] == [True] * 9 + [False] * 7
    assert events[0].position == Position(1, 3, 154, SNAPSHOT_ROW)
    assert events[-1].position == Position(1, 3, 2443, 0)
    assert events[-1].op == "d" and events[-1].key == (111,)
    assert sorted(events, key=lambda e: e.sort_key()) == events
    assert events[0].column_types == {
        "id": "int", "name": "string", "description": "string", "weight": "double"}
    # Snapshot rows carry source.ts_ms 0 (unknown), so the envelope's ts_ms stands in.
    assert events[0].source_ts == 1589355606100
    assert events[9].source_ts == 1589361987000
    assert [e.offset for e in events] == list(range(16))


def test_schema_less_records_take_key_columns_from_the_kafka_key(flink_lines, replay):
    decoder = DebeziumDecoder()
    events = []
    for offset, line in enumerate(flink_lines(FIXTURE)):
        payload = orjson.loads(line)["payload"]
        row = payload["after"] or payload["before"]
        key: dict[str, Any] = {"id": row["id"]}
        if offset % 2:  # the schema-wrapped key form, as JsonConverter writes it
            key = {"schema": {"type": "struct", "fields": [{"type": "int32", "field": "id"}]},
                   "payload": key}
        events += decoder.decode(encode(payload), offset=offset, key=encode(key))

    assert {e.key_columns for e in events} == {("id",)}
    assert set(replay(events)) == {(PRODUCTS, (i,)) for i in range(101, 111)}
    assert all(e.column_types is None for e in events)


def test_without_known_key_columns_the_key_is_empty():
    [event] = DebeziumDecoder().decode(encode(envelope(after={"id": 1})))
    assert event.key == () and event.key_columns == ()


def test_tombstone_is_skipped_and_counted():
    decoder = DebeziumDecoder()
    assert decoder.decode(None, key=b'{"id": 1}') == []
    assert decoder.decode(encode({"schema": None, "payload": None})) == []
    assert decoder.skipped["tombstone"] == 2


@pytest.mark.parametrize("op", ["m", "x"])
def test_unknown_ops_are_skipped_and_counted(op):
    decoder = DebeziumDecoder()
    assert decoder.decode(encode(envelope(op=op))) == []
    assert decoder.skipped == {f"unknown_op:{op}": 1}


def test_truncate_is_table_level():
    [event] = DebeziumDecoder(key_columns={PRODUCTS: ["id"]}).decode(encode(envelope(op="t")))
    assert (event.op, event.table, event.key, event.before, event.after) == (
        "t", PRODUCTS, (), None, None)


def test_update_changing_the_primary_key_splits_into_delete_and_create():
    doc = envelope(op="u", before={"id": 1, "name": "a"}, after={"id": 2, "name": "a"})
    delete, create = DebeziumDecoder(key_columns={PRODUCTS: ["id"]}).decode(
        encode(doc), offset=7)

    assert (delete.op, delete.key, delete.row_index) == ("d", (1,), 0)
    assert delete.before == {"id": 1, "name": "a"} and delete.after is None
    assert (create.op, create.key, create.row_index) == ("c", (2,), 1)
    assert create.after == {"id": 2, "name": "a"} and create.before is None
    assert delete.position == create.position and delete.offset == create.offset == 7
    assert delete.sort_key() < create.sort_key()


def test_key_change_split_also_works_with_a_kafka_key():
    doc = envelope(op="u", before={"id": 1}, after={"id": 2})
    events = DebeziumDecoder().decode(encode(doc), key=b'{"id": 2}')
    assert [(e.op, e.key) for e in events] == [("d", (1,)), ("c", (2,))]


def test_update_without_known_key_columns_is_not_split():
    doc = envelope(op="u", before={"id": 1}, after={"id": 2})
    [event] = DebeziumDecoder().decode(encode(doc))
    assert event.op == "u"


def test_delete_with_newkey_header_stays_a_plain_delete():
    doc = envelope(op="d", before={"id": 1})
    [event] = DebeziumDecoder(key_columns={PRODUCTS: ["id"]}).decode(
        encode(doc), headers=[("__debezium.newkey", b'{"id": 2}')])
    assert (event.op, event.key, event.after) == ("d", (1,), None)


def _decimal_b64(unscaled: int) -> str:
    raw = unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)
    return base64.b64encode(raw).decode()


ROW_FIELDS = [
    {"type": "int64", "optional": False, "field": "id"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "price"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "field": "born"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp", "field": "ts"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp",
     "field": "ts_us"},
    {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp",
     "field": "zoned"},
    {"type": "bytes", "optional": True, "field": "blob"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Json", "field": "doc"},
    {"type": "float32", "optional": True, "field": "ratio"},
]


def with_schema(payload: dict, fields: list[dict] = ROW_FIELDS) -> bytes:
    row = {"type": "struct", "fields": fields, "optional": True, "name": "db.t.Value"}
    schema = {"type": "struct", "name": "db.t.Envelope", "fields": [
        {**row, "field": "before"}, {**row, "field": "after"},
        {"type": "struct", "fields": [], "field": "source"},
        {"type": "string", "field": "op"}]}
    return encode({"schema": schema, "payload": payload})


def test_schema_logical_types_become_python_values():
    after = {"id": 1, "price": _decimal_b64(-123456), "born": 18262, "ts": 1589355606100,
             "ts_us": 1589355606100123, "zoned": "2020-05-13T09:40:06.5+02:00",
             "blob": base64.b64encode(b"\x00\xffab").decode(), "doc": '{"a": 1}',
             "ratio": None}
    [event] = DebeziumDecoder().decode(with_schema(envelope(after=after)))

    assert event.after == {
        "id": 1, "price": Decimal("-1234.56"), "born": date(2020, 1, 1),
        "ts": datetime(2020, 5, 13, 7, 40, 6, 100000),
        "ts_us": datetime(2020, 5, 13, 7, 40, 6, 100123),
        "zoned": datetime(2020, 5, 13, 7, 40, 6, 500000, tzinfo=UTC),
        "blob": b"\x00\xffab", "doc": '{"a": 1}', "ratio": None}
    assert event.column_types == {
        "id": "bigint", "price": "decimal(10,2)", "born": "date", "ts": "timestamp",
        "ts_us": "timestamp", "zoned": "timestamp", "blob": "binary", "doc": "json",
        "ratio": "float"}


def test_wide_decimals_keep_every_digit():
    fields = [{"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
               "parameters": {"scale": "30"}, "field": "amount"}]
    unscaled = 12345678901234567890123456789012345678901234567890
    [event] = DebeziumDecoder().decode(
        with_schema(envelope(after={"amount": _decimal_b64(unscaled)}), fields))
    assert event.after["amount"] == Decimal("12345678901234567890.123456789012345678901234567890")
    assert event.column_types == {"amount": "decimal(38,30)"}


def numeric(doc: dict, **numbers: str) -> bytes:
    """`doc` encoded, with `"<name>"` strings replaced by the numbers' JSON text, as the
    JsonConverter writes decimals with decimal.format=NUMERIC."""
    value = encode(doc)
    for name, text in numbers.items():
        value = value.replace(f'"{name}"'.encode(), text.encode())
    return value


def test_decimals_sent_as_json_numbers_keep_every_digit():
    fields = [{"type": "int64", "field": "id"},
              {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
               "parameters": {"scale": "2", "connect.decimal.precision": "20"},
               "field": "amount"},
              {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
               "parameters": {"scale": "2", "connect.decimal.precision": "10"},
               "field": "price"},
              {"type": "double", "field": "ratio"}]
    decoder = DebeziumDecoder()
    doc = {"id": 1, "amount": "AMOUNT", "price": "PRICE", "ratio": "RATIO"}
    records = [
        # The second with the same schema takes the cached-schema path.
        numeric(orjson.loads(with_schema(envelope(after=doc), fields)),
                AMOUNT="123456789012345678.91", PRICE="12.30", RATIO="0.1"),
        numeric(orjson.loads(with_schema(envelope(after=doc), fields)),
                AMOUNT="100000000000000000.01", PRICE="1E-2", RATIO="0.30000000000000004"),
        # Without a schema the decoder cannot tell a decimal from a double.
        numeric(envelope(after={"id": 1, "amount": "AMOUNT", "ratio": "RATIO"}),
                AMOUNT="123456789012345678.91", RATIO="2.5"),
    ]
    first, second, schemaless = (e for r in records for e in decoder.decode(r))
    assert first.after == {"id": 1, "amount": Decimal("123456789012345678.91"),
                           "price": Decimal("12.30"), "ratio": 0.1}
    assert first.column_types["amount"] == "decimal(20,2)"
    assert second.after == {"id": 1, "amount": Decimal("100000000000000000.01"),
                            "price": Decimal("0.01"), "ratio": 0.30000000000000004}
    assert schemaless.after == {"id": 1, "amount": Decimal("123456789012345678.91"),
                                "ratio": 2.5}
    assert type(schemaless.after["ratio"]) is float


def propagated(column: str, connect_type: str, source_type: str, length: int | None = None,
               scale: int | None = None, **more: Any) -> dict:
    """A row schema field as a connector with column.propagate.source.type writes it."""
    parameters = {"__debezium.source.column.type": source_type}
    if length is not None:
        parameters["__debezium.source.column.length"] = str(length)
    if scale is not None:
        parameters["__debezium.source.column.scale"] = str(scale)
    field = {"type": connect_type, "optional": True, "field": column, **more}
    field["parameters"] = {**field.get("parameters", {}), **parameters}
    return field


def test_propagated_source_types_type_the_columns_exactly():
    decimal = {"name": "org.apache.kafka.connect.data.Decimal"}
    fields = [
        # bigint.unsigned.handling.mode=precise: a Decimal of scale 0 and no precision.
        propagated("id", "bytes", "BIGINT UNSIGNED", 20, parameters={"scale": "0"},
                   **decimal),
        propagated("n", "int64", "INT UNSIGNED", 10),
        propagated("balance", "bytes", "DECIMAL", 20, 2,
                   parameters={"scale": "2", "connect.decimal.precision": "20"}, **decimal),
        propagated("note", "string", "VARCHAR", 40),
        propagated("shape", "struct", "GEOMETRY")]
    after = {"id": _decimal_b64(18446744073709551351), "n": 4294967295,
             "balance": _decimal_b64(12345678901234567891), "note": "x", "shape": None}
    [event] = DebeziumDecoder().decode(with_schema(envelope(after=after), fields))

    assert event.after == {"id": Decimal(18446744073709551351), "n": 4294967295,
                           "balance": Decimal("123456789012345678.91"), "note": "x",
                           "shape": None}
    assert event.column_types == {"id": "decimal(20,0)", "n": "bigint",
                                  "balance": "decimal(20,2)", "note": "string"}


def test_a_wrapped_unsigned_bigint_is_restored_when_its_type_is_propagated():
    # bigint.unsigned.handling.mode=long sends the Java long of the same 64 bits.
    fields = [propagated("id", "int64", "BIGINT UNSIGNED", 20)]
    [event] = DebeziumDecoder().decode(with_schema(envelope(after={"id": -265}), fields))
    assert event.after == {"id": 18446744073709551351}
    assert event.column_types == {"id": "decimal(20,0)"}


def test_converter_plan_is_built_once_per_row_schema():
    decoder = DebeziumDecoder()
    [first] = decoder.decode(with_schema(envelope(after={"id": 1, "born": 0})))
    [second] = decoder.decode(with_schema(envelope(after={"id": 2, "born": 1})))
    other_fields = [{"type": "int32", "field": "id"}]
    [third] = decoder.decode(with_schema(envelope(after={"id": 3}), other_fields))

    assert first.column_types is second.column_types
    assert third.column_types == {"id": "int"}
    assert second.after["born"] == date(1970, 1, 2)


def test_repeated_schema_blocks_decode_like_the_first():
    decoder = DebeziumDecoder()
    values = [with_schema(envelope(after={"id": i, "born": i})) for i in range(3)]
    # A schema holding a nested "payload" key, a value with a key after the payload and
    # an indented value must not be mistaken for the plain {"schema":…,"payload":…} layout.
    tricky = [{"type": "int32", "field": "id", "parameters": {"x": "1", "payload": "2"}}]
    values += [with_schema(envelope(after={"id": 7}), tricky)] * 2
    extra = orjson.loads(values[0])
    values.append(orjson.dumps({**extra, "extra": 1}))
    values.append(orjson.dumps(orjson.loads(values[1]), option=orjson.OPT_INDENT_2))

    events = [e for value in values for e in decoder.decode(value)]
    assert [(e.op, e.after) for e in events] == [
        ("c", {"id": 0, "born": date(1970, 1, 1)}), ("c", {"id": 1, "born": date(1970, 1, 2)}),
        ("c", {"id": 2, "born": date(1970, 1, 3)}), ("c", {"id": 7}), ("c", {"id": 7}),
        ("c", {"id": 0, "born": date(1970, 1, 1)}), ("c", {"id": 1, "born": date(1970, 1, 2)})]


def test_schema_change_record_becomes_ddl_per_table():
    record = {
        "source": {"db": "inventory", "table": "products", "file": "mysql-bin.000004",
                   "pos": 99, "row": 0, "snapshot": "false", "ts_ms": 1700000000000},
        "databaseName": "inventory", "schemaName": None,
        "ddl": "ALTER TABLE products ADD COLUMN price DECIMAL(10,2)",
        "tableChanges": [{"type": "ALTER", "id": '"inventory"."products"', "table": {
            "primaryKeyColumnNames": ["id"],
            "columns": [{"name": "id", "typeName": "INT", "jdbcType": 4},
                        {"name": "price", "typeName": "DECIMAL", "length": 10, "scale": 2},
                        {"name": "geo", "typeName": "GEOMETRY"}]}}],
    }
    [event] = DebeziumDecoder().decode(encode(record), offset=3)

    assert (event.op, event.table, event.key, event.key_columns) == (
        "ddl", PRODUCTS, (), ("id",))
    assert event.ddl == record["ddl"]
    assert event.position == Position(1, 4, 99, 0)
    assert event.column_types == {"id": "int", "price": "decimal(10,2)"}


def test_schema_change_without_a_table_is_skipped():
    decoder = DebeziumDecoder()
    record = {"source": {"db": "inventory", "file": "mysql-bin.000004", "pos": 4},
              "databaseName": "inventory", "ddl": "CREATE DATABASE inventory",
              "tableChanges": []}
    assert decoder.decode(encode(record)) == []
    assert decoder.skipped == {"debezium:ddl_without_table": 1}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (b"{not json", "JSON"),
        (b"[1, 2]", "JSON object"),
        (encode({k: v for k, v in envelope().items() if k != "op"}), "'op'"),
        (encode(envelope(after={"id": 1}, table=None)), "source.table"),
        (encode(envelope(after={"id": 1}, db="")), "source.db"),
        (encode({**envelope(), "source": "inventory"}), "'source'"),
        (encode(envelope(after=[1, 2])), "'after'"),
        (encode(envelope(op="d", before=None)), "'before'"),
        (encode(envelope(after={"id": 1}, pos="154")), "source.pos"),
        (encode(envelope(after={"id": 1}, file="mysql-bin")), "source.file"),
        (encode(envelope(after={"id": 1}, ts_ms="now")), "source.ts_ms"),
        (encode({"schema": {}, "payload": [1]}), "payload"),
        (with_schema(envelope(after={"id": 1, "born": "yesterday"})), "after.born"),
    ],
    ids=["invalid-json", "not-object", "no-op", "no-table", "no-db", "source-not-object",
         "after-not-object", "delete-without-before", "pos-string", "file-without-suffix",
         "ts-string", "payload-not-object", "value-against-schema"],
)
def test_malformed_records_raise_decode_error_naming_the_field(value, field):
    with pytest.raises(DecodeError, match="^debezium: ") as excinfo:
        DebeziumDecoder().decode(value)
    assert field in str(excinfo.value)


def test_key_column_missing_from_image_is_named():
    with pytest.raises(DecodeError, match="key column 'id' missing from 'after'"):
        DebeziumDecoder(key_columns={PRODUCTS: ["id"]}).decode(encode(envelope(after={"x": 1})))


def test_bad_kafka_key_is_a_decode_error():
    with pytest.raises(DecodeError, match="key"):
        DebeziumDecoder().decode(encode(envelope(after={"id": 1})), key=b"101")


def _position(**source: Any) -> Position:
    op = source.pop("op", "c")
    event = DebeziumDecoder().decode(encode(envelope(op=op, after={"id": 1}, **source)))[0]
    return event.position


def test_positions_compare_as_numbers_not_strings():
    assert _position(file="mysql-bin.000010", pos=4) > _position(file="mysql-bin.000009",
                                                                  pos=999999)
    assert _position(pos=100000) > _position(pos=99999)
    assert _position(pos=500, row=10) > _position(pos=500, row=9)


@pytest.mark.parametrize(
    "snapshot", ["true", "last", "first", "first_in_data_collection",
                 "last_in_data_collection", "incremental", True])
def test_snapshot_reads_count_at_their_position_below_what_streams_from_it(snapshot):
    snap = _position(snapshot=snapshot, file="mysql-bin.000099", pos=999999)
    assert snap.snapshot and snap.row == SNAPSHOT_ROW
    # Streamed from the position the snapshot read at, or later: newer.
    assert snap < _position(file="mysql-bin.000099", pos=999999)
    assert snap < _position(file="mysql-bin.000100", pos=4)
    # Streamed before it (a change the snapshot already read): older.
    assert snap > _position(file="mysql-bin.000099", pos=999998, row=7)
    assert snap > _position(file="mysql-bin.000001", pos=4)


@pytest.mark.parametrize("snapshot", ["false", None, False])
def test_not_a_snapshot(snapshot):
    assert not _position(snapshot=snapshot).snapshot
    assert _position(snapshot=snapshot, op="r").snapshot


@pytest.mark.parametrize("flag", ["last_in_data_collection", "last"])
def test_a_tables_last_snapshot_row_is_followed_by_its_snapshot_end(flag):
    # The end removes what the snapshot did not read (rows deleted while no snapshot ran):
    # a truncate of the table just below the snapshot's rows, after the row in Kafka order.
    decoder = DebeziumDecoder(key_columns={PRODUCTS: ["id"]})
    row, end = decoder.decode(encode(envelope("r", after={"id": 7}, snapshot=flag,
                                              server_id=0, gtid=None)), offset=9)
    assert (row.op, row.key, row.position) == ("r", (7,), Position(1, 3, 154, SNAPSHOT_ROW))
    assert (end.op, end.table, end.key, end.offset, end.row_index) == (
        "t", PRODUCTS, (), 9, 1)
    assert end.position == Position(1, 3, 154, SNAPSHOT_END_ROW)
    assert end.position < row.position
    assert end.position > _position(file="mysql-bin.000003", pos=153, row=99)
    [middle] = decoder.decode(encode(envelope("r", after={"id": 6}, snapshot="true")))
    assert middle.op == "r"


def test_origin_server_and_gtid_ride_with_the_event():
    decoder = DebeziumDecoder(key_columns={PRODUCTS: ["id"]})
    [streamed] = decoder.decode(encode(envelope("c", after={"id": 1}, server_id=2,
                                                gtid="0-2-11")))
    assert (streamed.server_id, streamed.gtid) == (2, "0-2-11")
    # A snapshot read has none: Debezium sends server id 0 and no GTID.
    [read] = decoder.decode(encode(envelope("r", after={"id": 1}, server_id=0, gtid=None,
                                            snapshot="true")))
    assert (read.server_id, read.gtid) == (None, None)


def test_transaction_metadata_records_are_skipped():
    decoder = DebeziumDecoder()
    assert decoder.decode(encode({"status": "BEGIN", "id": "571:53195829", "ts_ms": 1})) == []
    assert decoder.skipped == {"debezium:transaction": 1}


def test_drop_database_becomes_a_database_wide_ddl_event():
    # Debezium lists no tableChanges for DROP DATABASE; replicas of its tables must know.
    decoder = DebeziumDecoder()
    record = {"source": {"db": "inventory", "file": "mysql-bin.000004", "pos": 4},
              "databaseName": "inventory", "ddl": "DROP DATABASE `inventory`",
              "tableChanges": []}
    [event] = decoder.decode(encode(record), offset=5)
    assert (event.op, event.table, event.ddl) == ("ddl", "inventory.*", record["ddl"])
    assert decoder.skipped == {}


def test_snapshot_schema_changes_order_before_the_snapshot_rows():
    # Debezium's initial snapshot replays each table's schema (DROP TABLE IF EXISTS, DROP
    # DATABASE IF EXISTS, CREATE TABLE) into the schema-change topic and then reads the
    # rows into the tables' topics, all at one binlog position. The Kafka offset cannot
    # order events of different topics: a DROP DATABASE at offset 21 of the schema topic
    # must not land after the row at offset 3 of a table's topic (the replica would drop
    # the rows read before offset 21 of its own topic).
    decoder = DebeziumDecoder()
    source = {"db": "inventory", "file": "mysql-bin.000004", "pos": 154, "row": 0,
              "snapshot": "true", "ts_ms": 1700000000000}
    [drop] = decoder.decode(encode(
        {"source": source, "databaseName": "inventory", "tableChanges": [],
         "ddl": "DROP DATABASE IF EXISTS `inventory`"}), topic="dbserver1", offset=21)
    [row] = decoder.decode(encode(envelope("r", after={"id": 1}, **source)),
                           topic="dbserver1.inventory.products", offset=3)
    assert drop.sort_key() < row.sort_key()
    # A streamed DDL keeps its own binlog position.
    [alter] = decoder.decode(encode(
        {"source": {**source, "snapshot": "false", "pos": 999}, "databaseName": "inventory",
         "tableChanges": [], "ddl": "DROP DATABASE `inventory`"}), offset=22)
    assert alter.position == Position(1, 4, 999, 0)
    assert drop.position == Position(1, 4, 154, SNAPSHOT_SCHEMA_ROW)
