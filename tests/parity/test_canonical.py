"""The canonical text and checksum of rows, and chunking by key ranges: no server."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from binlog_assets.parity.canonical import (
    SEPARATOR,
    Fingerprint,
    chunk_sql,
    formatter,
    row_crc_sql,
    source_expression,
)
from binlog_assets.parity.check import differing_keys
from binlog_assets.parity.chunks import (
    KeyRange,
    chunk_index,
    key_value,
    next_upper_sql,
    orders_alike,
    range_sql,
)


def row_text(values: Sequence[Any], formats: Sequence[Callable[[Any], str]]) -> str:
    """The canonical text of one row's values (None: NULL), the rule `row_crc_sql` and
    `texts` implement: each non-null value's text, then a NULL flag per column."""
    texts = [f(v) for v, f in zip(values, formats, strict=True) if v is not None]
    texts.append("".join("1" if v is None else "0" for v in values))
    return SEPARATOR.join(texts)


def row_crc(values: Sequence[Any], formats: Sequence[Callable[[Any], str]]) -> int:
    return zlib.crc32(row_text(values, formats).encode("utf-8"))


@pytest.mark.parametrize(("arrow_type", "value", "text"), [
    (pa.int32(), -7, "-7"),
    (pa.int64(), 2**63 - 1, "9223372036854775807"),
    (pa.decimal128(20, 0), Decimal("18446744073709551615"), "18446744073709551615"),
    (pa.decimal128(10, 2), Decimal("179.00"), "179.00"),
    (pa.decimal128(12, 8), Decimal("0E-8"), "0.00000000"),  # never exponent notation
    (pa.decimal128(10, 2), Decimal("-0.50"), "-0.50"),
    (pa.float64(), 3.14, "3.140000"),
    (pa.float64(), 1 / 3, "0.333333"),
    (pa.float64(), 2.5e-7, "0.000000"),
    (pa.float64(), 1e20, "100000000000000000000.000000"),
    (pa.float32(), 3.140000104904175, "3.140000"),
    (pa.bool_(), True, "1"),
    (pa.date32(), date(2026, 11, 1), "2026-11-01"),
    (pa.date32(), date(99, 1, 2), "0099-01-02"),
    (pa.timestamp("us", tz="UTC"), datetime(2026, 11, 1, 9, 0, 0, 5, tzinfo=UTC),
     "2026-11-01 09:00:00.000005"),
    (pa.string(), "Grüße", "Grüße"),
    (pa.string(), "-838:59:59", "-838:59:59"),  # TIME, as the replica holds it
    (pa.binary(), b"\x00\xffA", "00FF41"),
])
def test_replica_values_read_as_the_source_server_writes_them(arrow_type, value, text) -> None:
    assert formatter(arrow_type)(value) == text


def test_a_type_without_a_rule_is_named() -> None:
    with pytest.raises(ValueError, match="list<item: int64>"):
        formatter(pa.list_(pa.int64()))


def test_row_text_separates_values_and_flags_nulls_as_concat_ws_does() -> None:
    formats = [formatter(pa.int64()), formatter(pa.string()), formatter(pa.string())]
    assert row_text([1, None, "a"], formats) == "1#a#010"
    assert row_text([1, "a", None], formats) == "1#a#001"  # NULL flags tell them apart
    assert row_crc([1, None, "a"], formats) == zlib.crc32(b"1#a#010")
    assert row_crc([1, None, "a"], formats) != row_crc([1, "a", None], formats)


@pytest.mark.parametrize(("data_type", "sql"), [
    ("int", "`n`"), ("BIGINT", "`n`"), ("decimal", "`n`"), ("date", "`n`"),
    ("double", "CAST(`n` AS DECIMAL(65,6))"),
    ("datetime", "DATE_FORMAT(`n`, '%%Y-%%m-%%d %%H:%%i:%%s.%%f')"),  # %s parameters
    ("timestamp", "DATE_FORMAT(`n`, '%%Y-%%m-%%d %%H:%%i:%%s.%%f')"),
    ("varchar", "CONVERT(`n` USING utf8mb4)"), ("json", "CONVERT(`n` USING utf8mb4)"),
    ("varbinary", "HEX(`n`)"), ("bit", None), ("geometry", None),
])
def test_source_expressions_follow_the_replica_rules(data_type: str, sql: str | None) -> None:
    assert source_expression("n", data_type) == sql


def test_the_source_sql_hashes_the_same_text_with_its_null_flags() -> None:
    sql = row_crc_sql([("id", "int"), ("na`me", "varchar")])
    assert sql == ("CRC32(CONVERT(CONCAT_WS('#', `id`, CONVERT(`na``me` USING utf8mb4), "
                   "CONCAT(ISNULL(`id`), ISNULL(`na``me`))) USING utf8mb4))")
    agg = chunk_sql("`s`.`t`", [("id", "int")], "TRUE")
    assert agg.startswith("SELECT COUNT(*), COALESCE(SUM(c), 0), COALESCE(BIT_XOR(c), 0)")


def test_a_fingerprint_is_a_multiset_checksum() -> None:
    a, b = Fingerprint.of([1, 2, 3]), Fingerprint.of([3, 1, 2])
    assert a == b  # order never matters
    assert Fingerprint.of([5, 5]) != Fingerprint.of([])  # equal rows do not cancel out
    assert Fingerprint.of([5, 5]) != Fingerprint.of([4, 6])  # same sum, other XOR
    total = Fingerprint.of([1])
    total += Fingerprint.of([2, 3])
    assert total == a


def test_composite_key_ranges_are_expanded_for_the_range_optimizer() -> None:
    where, params = range_sql(["a", "b"], KeyRange((1, 2), (5, 6)))
    assert where == ("((`a` > %s) OR (`a` = %s AND `b` > %s)) AND "
                     "((`a` < %s) OR (`a` = %s AND `b` <= %s))")
    assert params == [1, 1, 2, 5, 5, 6]
    assert range_sql(["id"], KeyRange(None, None)) == ("TRUE", [])
    assert range_sql(["id"], KeyRange(None, (9,))) == ("((`id` <= %s))", [9])
    sql, params = next_upper_sql("`s`.`t`", ["id"], (100,), 1000)
    assert sql == ("SELECT `id` FROM `s`.`t` WHERE ((`id` > %s)) ORDER BY `id` "
                   "LIMIT 1 OFFSET 999")
    assert params == [100]


def test_replica_keys_fall_in_the_chunk_whose_range_holds_them() -> None:
    uppers = [(10,), (20,), None]  # (-inf, 10], (10, 20], (20, +inf)
    assert [chunk_index(uppers, (k,)) for k in (-5, 10, 11, 20, 21, 10**9)] == \
        [0, 0, 1, 1, 2, 2]
    assert chunk_index([None], (5,)) == 0
    composite = [(1, "b"), (2, "a"), None]
    assert [chunk_index(composite, k) for k in ((1, "a"), (1, "b"), (1, "c"), (3, ""))] == \
        [0, 0, 1, 2]


def test_key_values_compare_alike_on_both_sides() -> None:
    # The source session reads instants in UTC as naive datetimes; the replica as UTC.
    aware = datetime(2026, 1, 1, 10, 0, tzinfo=timezone(timedelta(hours=1)))
    assert key_value(aware) == datetime(2026, 1, 1, 9, 0)
    assert key_value(Decimal("18446744073709551615")) == 18446744073709551615
    assert key_value(Decimal("1.50")) == Decimal("1.5")
    assert orders_alike("int", None) and orders_alike("datetime", None)
    assert orders_alike("varchar", "utf8mb4_bin")
    assert not orders_alike("varchar", "utf8mb4_general_ci")  # 'a' = 'A' there
    assert not orders_alike("time", None)


def test_differing_keys_name_missing_extra_and_changed_rows() -> None:
    source = {(1,): 11, (2,): 22, (3,): 33}
    replica = {(1,): [11], (2,): [99], (4,): [44]}
    assert differing_keys(source, replica, 10) == [
        "2: differs", "3: missing in replica", "4: extra in replica"]
    assert differing_keys(source, replica, 1) == ["2: differs"]
    assert differing_keys({(1,): 5}, {(1,): [5, 5]}, 10) == ["1: differs"]
    # Rows a change after the snapshot touched may differ from it.
    assert differing_keys(source, replica, 10, later={(2,), (4,)}) == [
        "3: missing in replica"]


def test_arrow_kernels_write_the_same_texts_as_the_row_formatters() -> None:
    """`texts` (Arrow kernels, the replica side's fast path) agrees with `row_text` for
    every type, NULLs and all-NULL rows included."""
    from binlog_assets.parity.canonical import crcs_of, texts

    columns = [
        pa.array([1, None, -3, None], pa.int32()),
        pa.array([Decimal("179.00"), Decimal("-0.50"), None, None], pa.decimal128(10, 2)),
        pa.array([Decimal("0E-8"), Decimal("1E-7"), None, None], pa.decimal128(12, 8)),
        pa.array([3.14, None, 1e20, None], pa.float64()),
        pa.array([True, False, None, None], pa.bool_()),
        pa.array([date(2026, 11, 1), date(99, 1, 2), None, None], pa.date32()),
        pa.array([datetime(2026, 11, 1, 9, 0, 0, 5, tzinfo=UTC), None,
                  datetime(2026, 1, 1, tzinfo=UTC), None], pa.timestamp("us", tz="UTC")),
        pa.array(["Grüße", "a#b", None, None], pa.string()),
        pa.array([b"\x00\xff", None, b"", None], pa.binary()),
        pa.nulls(4, pa.string()),  # a column the replica lacks
    ]
    formats = [formatter(c.type) for c in columns]
    rows = list(zip(*(c.to_pylist() for c in columns), strict=True))
    expected = [row_text(row, formats) for row in rows]
    assert texts(columns).to_pylist() == expected
    assert expected[3] == "1111111111"  # every value NULL: the flags alone
    assert crcs_of(columns, 4) == [row_crc(row, formats) for row in rows]
