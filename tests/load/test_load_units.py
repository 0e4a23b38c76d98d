"""The initial load's parts without a database: plans, value conversion, progress, the
changelog's exactly-once chunk commits and the settings."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from binlog_assets.config import ConfigError, parse_config
from binlog_assets.load.loader import LoadProgress
from binlog_assets.load.plan import LoadPlan
from binlog_assets.load.reader import _converter
from binlog_assets.parity.chunks import KeyRange


def test_a_plan_keeps_its_key_values_and_their_types_through_json() -> None:
    uppers = ((5, "a"), (Decimal("1.50"), datetime(2026, 1, 2, 3, 4, 5, 6)),
              (date(2026, 1, 2), b"\x00\xff"), (timedelta(hours=-3, microseconds=1), 2.5),
              (True, None), None)
    plan = LoadPlan("abc", "shop.t", ("a", "b"), uppers, 2)
    again = LoadPlan.from_json(plan.to_json())
    assert again == plan
    assert [type(v) for v in again.uppers[1]] == [Decimal, datetime]
    assert type(again.uppers[2][0]) is date  # not a datetime


def test_chunks_cover_every_key_and_slots_take_turns() -> None:
    plan = LoadPlan("abc", "shop.t", ("id",), ((10,), (20,), (30,), None), 3)
    assert [plan.chunk(i) for i in range(4)] == [
        KeyRange(None, (10,)), KeyRange((10,), (20,)), KeyRange((20,), (30,)),
        KeyRange((30,), None)]
    assert [list(plan.slot_chunks(s)) for s in range(3)] == [[0, 3], [1], [2]]


def test_a_key_value_without_a_plan_form_is_named() -> None:
    plan = LoadPlan("abc", "shop.t", ("id",), (({1},), None), 1)
    with pytest.raises(ValueError, match="a key value of type set has no plan form"):
        plan.to_json()


@pytest.mark.parametrize(("column_type", "canonical", "value", "held"), [
    # TIME as the stream writes it: text, hours past 24 and negative included.
    ("time(3)", "string", timedelta(hours=30, milliseconds=5), "30:00:00.005000"),
    ("time", "string", -timedelta(minutes=1), "-00:01:00"),
    ("set('a','b','c')", "string", {"c", "a"}, "a,c"),
    ("bit(1)", "boolean", b"\x01", True),
    ("bit(1)", "boolean", b"\x00", False),
    ("bit(12)", None, b"\x01\x02", 258),
    ("varchar(10)", "string", b"caf\xc3\xa9", "café"),
    ("json", "json", '{"a": 1}', '{"a": 1}'),
    ("timestamp(6)", "timestamp", datetime(2026, 1, 1, 12, tzinfo=UTC),
     datetime(2026, 1, 1, 12)),
])
def test_driver_values_become_the_streams(column_type, canonical, value, held) -> None:
    convert = _converter(column_type, canonical)
    assert convert is not None and convert(value) == held
    assert convert(None) is None


@pytest.mark.parametrize("column_type", ["int(11)", "bigint(20)", "decimal(10,2)", "date",
                                         "double", "varbinary(16)"])
def test_values_the_driver_gives_as_the_stream_does_are_kept(column_type) -> None:
    from binlog_assets.formats.mysql_types import mysql_type

    assert _converter(column_type, mysql_type(column_type).canonical) is None


def test_progress_says_rows_rate_and_time_to_go() -> None:
    state = LoadProgress(chunks=10, chunks_done=4, rows=400_000, skipped=2)
    state.started -= 8.0  # 2 chunks read in 8 s: 4 s each, 6 to go
    assert state.eta_seconds == pytest.approx(24.0, rel=0.01)
    assert state.describe().startswith("4/10 chunks, 400,000 rows, ")
    assert LoadProgress(chunks=3).eta_seconds is None


def test_a_chunk_committed_once_is_not_committed_again(tmp_path: Path) -> None:
    """A resumed slot's chunk: the changelog holds its transaction, so the append is
    skipped, and the rows are there once."""
    from deltalake import DeltaTable

    from binlog_assets.lakehouse.changelog import ChangelogWriter

    pipeline = parse_config({"lakehouse": {"path": str(tmp_path), "database": "t"}})
    writer = ChangelogWriter(pipeline)
    now = datetime.now(UTC)
    row = ("", -1, -1, 0, "shop.t", "r", '{"id": 1}', ["id"], None, '{"id": 1}', 1, 3, 400,
           0, None, None, '{"id": "int"}', None, None, now, None, None)
    first = writer.append_rows([row], "load/x/shop.t/0", now, txn=("binlake-load/x/0", 1))
    assert first is not None
    assert writer.append_rows([row], "load/x/shop.t/0", now, txn=("binlake-load/x/0", 1)) is None
    assert ChangelogWriter(pipeline).append_rows(
        [row], "load/x/shop.t/0", now, txn=("binlake-load/x/0", 1)) is None
    table = DeltaTable(writer.uri)
    assert table.transaction_version("binlake-load/x/0") == 1
    assert table.to_pyarrow_table(columns=["op"]).num_rows == 1


@pytest.mark.parametrize(("load", "message"), [
    ({"workers": 0}, "load.workers: Input should be greater than or equal to 1"),
    ({"chunk_rows": 0}, "load.chunk_rows: Input should be greater than or equal to 1"),
    ({"pause_seconds": -1}, "load.pause_seconds: Input should be greater than or equal to 0"),
    ({"parallel": 2}, "load.parallel: Extra inputs are not permitted"),
])
def test_bad_load_settings_fail_naming_the_field(load, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"load": load})
