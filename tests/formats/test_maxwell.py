from __future__ import annotations

from decimal import Decimal
from typing import Any

import orjson
import pytest

from binlog_assets.formats.event import SNAPSHOT_ROW, DecodeError, Position
from binlog_assets.formats.maxwell import MaxwellDecoder

PRODUCT = "test.product"


def row(kind: str = "insert", data: Any = None, **fields: Any) -> bytes:
    doc = {"database": "test", "table": "product", "type": kind, "ts": 1596684883,
           "xid": 7125, "data": {"id": 1, "name": "a"} if data is None else data,
           "primary_key_columns": ["id"]}
    doc.update(fields)
    return orjson.dumps({k: v for k, v in doc.items() if v is not ...})


def test_fixture_ends_with_101_and_104_to_110_live(flink_lines, decode_lines, replay):
    decoder = MaxwellDecoder()
    events = decode_lines(decoder, flink_lines("maxwell-data.txt"))

    state = replay(events)
    assert set(state) == {(PRODUCT, (i,)) for i in (101, *range(104, 111))}
    assert state[(PRODUCT, (101,))] == {
        "id": 101, "name": "scooter", "description": "Small 2-wheel scooter", "weight": 5.17}
    assert state[(PRODUCT, (106,))]["description"] == "18oz carpenter hammer"
    assert state[(PRODUCT, (107,))]["weight"] == 5.1
    assert state[(PRODUCT, (110,))] == {
        "id": 110, "name": "jacket", "description": "new water resistent white wind breaker",
        "weight": 0.5}
    assert not decoder.skipped


def test_fixture_events_order_by_kafka_offset_without_binlog_coordinates(
    flink_lines, decode_lines
):
    events = decode_lines(MaxwellDecoder(), flink_lines("maxwell-data.txt"))
    assert len(events) == 20
    assert {e.position for e in events} == {Position(1, 0, 0, 0)}
    assert sorted(events, key=lambda e: e.sort_key()) == events
    assert events[0].source_ts == 1596684883000
    assert events[9].before == {"id": 106, "name": "hammer",
                                "description": "16oz carpenter's hammer", "weight": 1.0}


def test_before_image_is_data_overlaid_with_old():
    [event] = MaxwellDecoder().decode(
        row("update", {"id": 1, "name": "b", "qty": 3}, old={"name": "a"}))
    assert event.op == "u"
    assert event.before == {"id": 1, "name": "a", "qty": 3}
    assert event.after == {"id": 1, "name": "b", "qty": 3}


def test_numbers_too_long_for_a_double_keep_every_digit():
    # Maxwell writes a DECIMAL as a JSON number; a double holds 15 digits at most.
    value = (b'{"database":"test","table":"product","type":"update","ts":1596684883,'
             b'"primary_key_columns":["id"],'
             b'"data":{"id":1,"amount":123456789012345678.91,"tiny":1E-7,"weight":3.14,'
             b'"huge":123456789012345678901234567890,"unsigned":18446744073709551351},'
             b'"old":{"amount":100000000000000000.01}}')
    [event] = MaxwellDecoder().decode(value)
    assert event.after == {"id": 1, "amount": Decimal("123456789012345678.91"),
                           "tiny": 1e-07, "weight": 3.14,
                           "huge": Decimal("123456789012345678901234567890"),
                           "unsigned": 18446744073709551351}
    assert type(event.after["amount"]) is Decimal and type(event.after["weight"]) is float
    assert event.before["amount"] == Decimal("100000000000000000.01")


def test_update_changing_the_primary_key_splits_into_delete_and_create():
    delete, create = MaxwellDecoder().decode(
        row("update", {"id": 2, "name": "a"}, old={"id": 1}), offset=5)
    assert (delete.op, delete.key, delete.row_index, delete.after) == ("d", (1,), 0, None)
    assert delete.before == {"id": 1, "name": "a"}
    assert (create.op, create.key, create.row_index, create.before) == ("c", (2,), 1, None)
    assert create.after == {"id": 2, "name": "a"}


def test_delete_carries_the_row_as_before_image():
    [event] = MaxwellDecoder().decode(row("delete", {"id": 1, "name": "a"}))
    assert (event.op, event.key, event.before, event.after) == (
        "d", (1,), {"id": 1, "name": "a"}, None)


def test_bootstrap_insert_is_a_snapshot_read_and_markers_are_skipped():
    decoder = MaxwellDecoder()
    assert decoder.decode(row("bootstrap-start", data=..., ts=1)) == []
    [event] = decoder.decode(row("bootstrap-insert"))
    assert decoder.decode(row("bootstrap-complete", data=...)) == []

    assert (event.op, event.position) == ("r", Position(1, 0, 0, SNAPSHOT_ROW))
    assert event.position < Position(1, 0, 0, 0)
    assert decoder.skipped == {"maxwell:bootstrap-start": 1, "maxwell:bootstrap-complete": 1}


def test_table_ddl_is_a_ddl_event():
    definition = {"database": "test", "table": "product", "primary-key": ["id"], "columns": [
        {"type": "int", "name": "id", "signed": False},
        {"type": "varchar", "name": "name", "charset": "utf8mb4"},
        {"type": "decimal", "name": "price", "precision": 10, "scale": 2},
        {"type": "geometry", "name": "geo"}]}
    sql = "ALTER TABLE product ADD price DECIMAL(10,2)"
    value = row("table-alter", data=..., primary_key_columns=..., sql=sql, old={},
                position="master.000006:800911", **{"def": definition})
    [event] = MaxwellDecoder().decode(value)

    assert (event.op, event.table, event.key, event.key_columns) == (
        "ddl", PRODUCT, (), ("id",))
    assert event.ddl == sql
    assert event.position == Position(1, 6, 800911, 0)
    assert event.column_types == {"id": "bigint", "name": "string", "price": "decimal(10,2)"}


def test_database_ddl_is_skipped_and_counted():
    decoder = MaxwellDecoder()
    value = row("database-create", data=..., table=..., sql="CREATE DATABASE x")
    assert decoder.decode(value) == []
    assert decoder.skipped == {"maxwell:database-create": 1}


def test_tombstone_and_unknown_types_are_counted():
    decoder = MaxwellDecoder()
    assert decoder.decode(None) == []
    assert decoder.decode(row("heartbeat")) == []
    assert decoder.skipped == {"tombstone": 1, "unknown_op:heartbeat": 1}


def test_position_is_parsed_with_xoffset_as_row():
    [event] = MaxwellDecoder().decode(row(position="master.000006:800911", xoffset=3))
    assert event.position == Position(1, 6, 800911, 3)


def test_positions_compare_as_numbers_not_strings():
    def position(text: str) -> Position:
        return MaxwellDecoder().decode(row(position=text))[0].position

    assert position("master.000010:4") > position("master.000009:999999")
    assert position("master.000009:100000") > position("master.000009:99999")


def test_gtid_sequence_orders_when_there_is_no_position():
    def position(gtid: str, xoffset: int = 0) -> Position:
        return MaxwellDecoder().decode(row(gtid=gtid, xoffset=xoffset))[0].position

    uuid = "c7c98333-6006-11ed-bfc9-b8cef6e1a231"
    assert position(f"{uuid}:10") == Position(1, 0, 10, 0)
    assert position(f"{uuid}:10", 2) > position(f"{uuid}:9", 5)
    assert position("0-1-42") == Position(1, 0, 42, 0)


def test_key_columns_fall_back_to_the_kafka_key():
    value = row(primary_key_columns=..., data={"id": 7, "sku": "x"})
    hash_key = b'{"database":"test","table":"product","pk.id":7,"pk.sku":"x"}'
    array_key = b'["test","product",[{"id":7},{"sku":"x"}]]'
    for key in (hash_key, array_key):
        [event] = MaxwellDecoder().decode(value, key=key)
        assert (event.key_columns, event.key) == (("id", "sku"), (7, "x"))
    [keyless] = MaxwellDecoder().decode(value)
    assert (keyless.key_columns, keyless.key) == ((), ())


def test_key_column_override_wins():
    [event] = MaxwellDecoder(key_columns={PRODUCT: ["name"]}).decode(row())
    assert event.key == ("a",)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (b'{"database": "test"', "JSON"),
        (b'"insert"', "JSON object"),
        (row(type=...), "'type'"),
        (row(table=...), "'table'"),
        (row(database=None), "'database'"),
        (row(data="id=1"), "'data'"),
        (row("update", old=[1]), "'old'"),
        (row(ts="1596684883"), "'ts'"),
        (row(position="master.000006"), "'position'"),
        (row(position="master:800911"), "'position'"),
        (row(xoffset="1"), "'xoffset'"),
        (row(gtid="abc"), "'gtid'"),
        (row(primary_key_columns="id"), "'primary_key_columns'"),
        (row(data={"name": "a"}), "key column 'id'"),
    ],
    ids=["invalid-json", "not-object", "no-type", "no-table", "no-database", "data-string",
         "old-list", "ts-string", "position-no-offset", "position-no-file-index",
         "xoffset-string", "gtid-no-sequence", "pk-columns-string", "pk-missing"],
)
def test_malformed_records_raise_decode_error_naming_the_field(value, field):
    with pytest.raises(DecodeError, match="^maxwell: ") as excinfo:
        MaxwellDecoder().decode(value)
    assert field in str(excinfo.value)
