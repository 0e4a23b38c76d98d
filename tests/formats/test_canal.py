from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any

import orjson
import pytest

from binlog_assets.formats.canal import CanalDecoder
from binlog_assets.formats.event import DecodeError, Position

PRODUCTS = "inventory.products2"
TYPES = {"id": "int(11)", "name": "varchar(255)"}


def message(kind: str = "INSERT", data: Any = None, **fields: Any) -> bytes:
    doc = {"data": [{"id": "1", "name": "a"}] if data is None else data,
           "database": "inventory", "es": 1589373515000, "id": 3, "isDdl": False,
           "mysqlType": TYPES, "old": None, "pkNames": ["id"], "sql": "",
           "table": "products2", "ts": 1589373515477, "type": kind}
    doc.update(fields)
    return orjson.dumps({k: v for k, v in doc.items() if v is not ...})


def test_fixture_ends_with_101_and_104_to_110_live(flink_lines, decode_lines, replay):
    decoder = CanalDecoder()
    events = decode_lines(decoder, flink_lines("canal-data.txt"))

    state = replay(events)
    assert set(state) == {(PRODUCTS, (i,)) for i in (101, *range(104, 111))}
    assert state[(PRODUCTS, (101,))] == {
        "id": 101, "name": "scooter", "description": "Small 2-wheel scooter", "weight": 5.17}
    assert state[(PRODUCTS, (106,))]["description"] == "18oz carpenter hammer"
    assert state[(PRODUCTS, (107,))]["weight"] == 5.1
    assert state[(PRODUCTS, (110,))] == {
        "id": 110, "name": "jacket", "description": "new water resistent white wind breaker",
        "weight": 0.5}
    assert not decoder.skipped


def test_fixture_rows_are_events_in_list_order(flink_lines, decode_lines):
    events = decode_lines(CanalDecoder(), flink_lines("canal-data.txt"))

    first_message = [e for e in events if e.offset == 0]
    assert [e.key for e in first_message] == [(i,) for i in range(101, 110)]
    assert [e.row_index for e in first_message] == list(range(9))
    assert {e.position for e in events} == {Position()}
    assert sorted(events, key=lambda e: e.sort_key()) == events
    assert events[0].column_types == {
        "id": "int", "name": "string", "description": "string", "weight": "float"}
    assert events[0].source_ts == 1589373515000
    update_101 = next(e for e in events if e.op == "u" and e.key == (101,))
    assert update_101.before["weight"] == 3.14 and update_101.after["weight"] == 5.17


def test_filter_table_fixture(flink_lines, decode_lines, replay):
    lines = flink_lines("canal-data-filter-table.txt")
    decoder = CanalDecoder()
    events = decode_lines(decoder, lines[:-1])

    assert {e.table for e in events} == {"mydb.product", "mydb.orders", "mydb.projects"}
    [ddl] = [e for e in events if e.table == "mydb.projects"]
    assert ddl.op == "ddl" and ddl.ddl.startswith("CREATE TABLE project (")
    state = replay(events)
    assert {k for k in state if k[0] == "mydb.product"} == {
        ("mydb.product", (i,)) for i in (101, *range(104, 111))}
    assert state[("mydb.orders", (10001,))] == {
        "order_number": 10001, "order_date": date(2016, 1, 16), "purchaser": 1001,
        "quantity": 3, "product_id": 102}
    assert {k for k in state if k[0] == "mydb.orders"} == {
        ("mydb.orders", (n,)) for n in (10001, 10003, 10004)}

    # The last message declares `project.id` as int(11) but carries "A101": a typed
    # replica cannot hold it, so it is refused rather than passed through as text.
    with pytest.raises(DecodeError, match=r"'data\[0\]\.id' value 'A101' does not parse as int"):
        decoder.decode(lines[-1], offset=len(lines) - 1)


def test_values_are_typed_with_mysql_type():
    types = {"id": "bigint(20) unsigned", "price": "decimal(10,2)", "born": "date",
             "seen": "datetime(3)", "ts": "timestamp", "ratio": "double", "blob": "blob",
             "flag": "tinyint(1)", "doc": "json", "zero": "datetime", "bits": "bit(1)"}
    data = [{"id": "18446744073709551615", "price": "-12.50", "born": "2020-01-31",
             "seen": "2020-05-13 12:34:56.789", "ts": "2020-05-13 12:34:56", "ratio": "1e-3",
             "blob": "\u0000\u00ffab", "flag": "1", "doc": '{"a":1}',
             "zero": "0000-00-00 00:00:00", "bits": "1", "extra": "x", "missing": None}]
    [event] = CanalDecoder().decode(message(data=data, mysqlType=types, pkNames=["id"]))

    assert event.after == {
        "id": 18446744073709551615, "price": Decimal("-12.50"), "born": date(2020, 1, 31),
        "seen": datetime(2020, 5, 13, 12, 34, 56, 789000), "ts": datetime(2020, 5, 13, 12, 34, 56),
        "ratio": 0.001, "blob": b"\x00\xffab", "flag": 1, "doc": '{"a":1}', "zero": None,
        "bits": "1", "extra": "x", "missing": None}
    assert event.column_types == {
        "id": "decimal(20,0)", "price": "decimal(10,2)", "born": "date", "seen": "timestamp",
        "ts": "timestamp", "ratio": "double", "blob": "binary", "flag": "int", "doc": "json",
        "zero": "timestamp"}


def test_primary_key_change_splits_within_a_many_row_message():
    data = [{"id": "3", "name": "a"}, {"id": "2", "name": "c"}]
    old = [{"id": "1"}, {"name": "b"}]
    events = CanalDecoder().decode(message("UPDATE", data, old=old), offset=9)

    assert [(e.op, e.key, e.row_index) for e in events] == [
        ("d", (1,), 0), ("c", (3,), 1), ("u", (2,), 2)]
    assert events[0].before == {"id": 1, "name": "a"}
    assert events[2].before == {"id": 2, "name": "b"} and events[2].after == {"id": 2, "name": "c"}
    assert [e.sort_key() for e in events] == sorted(e.sort_key() for e in events)


def test_delete_carries_rows_as_before_images():
    [event] = CanalDecoder().decode(message("DELETE"))
    assert (event.op, event.key, event.before, event.after) == (
        "d", (1,), {"id": 1, "name": "a"}, None)


def test_table_without_primary_key_has_empty_key():
    [event] = CanalDecoder().decode(message(pkNames=None))
    assert (event.key, event.key_columns) == ((), ())


def test_ddl_messages():
    decoder = CanalDecoder()
    [create] = decoder.decode(message("CREATE", ..., isDdl=True, mysqlType=None,
                                      sql="CREATE TABLE t (id int)"))
    [truncate] = decoder.decode(message("TRUNCATE", ..., isDdl=True,
                                        sql="TRUNCATE products2"))
    assert decoder.decode(message("CREATE", ..., isDdl=True, table="",
                                  sql="CREATE DATABASE x")) == []

    assert (create.op, create.table, create.ddl) == ("ddl", PRODUCTS, "CREATE TABLE t (id int)")
    assert (truncate.op, truncate.key) == ("t", ())
    assert decoder.skipped == {"canal:ddl_without_table": 1}


def test_tombstone_and_unknown_types_are_counted():
    decoder = CanalDecoder()
    assert decoder.decode(None) == []
    assert decoder.decode(message("QUERY")) == []
    assert decoder.skipped == {"tombstone": 1, "unknown_op:QUERY": 1}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (b"{,}", "JSON"),
        (b"[]", "JSON object"),
        (message(type=...), "'type'"),
        (message(table=...), "'table'"),
        (message(database=""), "'database'"),
        (message(data={"id": "1"}), "'data'"),
        (message(data=["1"]), "'data[0]'"),
        (message(data=[{"id": 1}]), "'data[0].id'"),
        (message(data=[{"id": "one"}]), "'data[0].id'"),
        (message("UPDATE", old=[]), "'old'"),
        (message(es="1589373515000"), "'es'"),
        (message(mysqlType=["int"]), "'mysqlType'"),
        (message(pkNames="id"), "'pkNames'"),
        (message(data=[{"name": "a"}]), "key column 'id'"),
    ],
    ids=["invalid-json", "not-object", "no-type", "no-table", "no-database", "data-object",
         "row-not-object", "value-not-string", "value-not-int", "old-misaligned", "es-string",
         "mysql-type-list", "pk-names-string", "pk-missing"],
)
def test_malformed_messages_raise_decode_error_naming_the_field(value, field):
    with pytest.raises(DecodeError, match="^canal: ") as excinfo:
        CanalDecoder().decode(value)
    assert field in str(excinfo.value)
