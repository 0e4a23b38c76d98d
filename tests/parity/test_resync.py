"""A re-synced chunk as change events: values as a decoder gives them, the replica's
types declared, deletes for the replica's rows the source lacks; no server."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest

from binlog_assets.parity.chunks import KeyRange
from binlog_assets.parity.resync import ReplicaSide, _events, canonical_type, event_value
from binlog_assets.parity.source import BinlogPosition, SourceTable


@pytest.mark.parametrize(("value", "arrow_type", "held"), [
    (timedelta(hours=-1, microseconds=-500_000), pa.string(), "-01:00:00.500000"),
    (timedelta(hours=838, minutes=59, seconds=59), pa.string(), "838:59:59"),
    # The session reads in UTC; decoders give naive UTC timestamps.
    (datetime(2026, 11, 1, 9, 0, 0, 5), pa.timestamp("us", tz="UTC"),
     datetime(2026, 11, 1, 9, 0, 0, 5)),
    (datetime(2026, 11, 1, 9, 0, tzinfo=UTC), pa.timestamp("us", tz="UTC"),
     datetime(2026, 11, 1, 9, 0)),  # a replica row's value, read back by Arrow
    (18446744073709551615, pa.decimal128(20, 0), Decimal("18446744073709551615")),
    (1, pa.bool_(), True),
    (b"caf\xc3\xa9", pa.string(), "café"),
    (7, pa.string(), "7"),
    ({"b", "a"}, pa.string(), "a,b"),
    (None, pa.int32(), None),
    (Decimal("1.50"), pa.decimal128(10, 2), Decimal("1.50")),
    (b"\x00\xff", pa.binary(), b"\x00\xff"),
    (date(2026, 1, 2), None, date(2026, 1, 2)),  # a column the replica lacks
])
def test_values_are_held_as_a_decoder_gives_them(value, arrow_type, held) -> None:
    assert event_value(value, arrow_type) == held


@pytest.mark.parametrize(("arrow_type", "name"), [
    (pa.int32(), "int"), (pa.int16(), "int"), (pa.int64(), "bigint"),
    (pa.decimal128(12, 2), "decimal(12,2)"), (pa.float64(), "double"),
    (pa.float32(), "float"), (pa.bool_(), "boolean"), (pa.date32(), "date"),
    (pa.timestamp("us", tz="UTC"), "timestamp"), (pa.string(), "string"),
    (pa.large_string(), "string"), (pa.binary(), "binary"),
    (pa.list_(pa.int32()), None),
])
def test_the_replica_types_are_declared_by_their_canonical_names(arrow_type, name) -> None:
    assert canonical_type(arrow_type) == name


def test_a_chunk_becomes_reads_at_its_position_and_deletes_of_rows_the_source_lacks(
        tmp_path) -> None:
    from deltalake import write_deltalake

    schema = pa.schema([("id", pa.int32()), ("price", pa.decimal128(10, 2)),
                        ("seen", pa.timestamp("us", tz="UTC")), ("_source_db", pa.string()),
                        ("_source_table", pa.string()), ("_op", pa.string()),
                        ("_position", pa.struct([("phase", pa.int32()), ("file", pa.int64())]))])
    seen = datetime(2026, 11, 1, 9, tzinfo=UTC)
    rows = [(1, "1.00", "c"), (2, "2.00", "u"), (3, "3.00", "d"), (4, "4.00", "c"),
            (9, "9.00", "c")]
    uri = str(tmp_path / "replica")
    write_deltalake(uri, pa.table({
        "id": [r[0] for r in rows], "price": [Decimal(r[1]) for r in rows],
        "seen": [seen] * len(rows), "_source_db": ["shop"] * len(rows),
        "_source_table": ["items"] * len(rows), "_op": [r[2] for r in rows],
        "_position": [{"phase": 1, "file": 3}] * len(rows)}, schema=schema))
    table = SourceTable("shop", "items", (("ID", "int"), ("price", "decimal")), ("ID",),
                        True, (), ("ID",))
    source = [{"ID": 1, "price": Decimal("1.50"), "seen": datetime(2026, 11, 2, 8)},
              {"ID": 5, "price": Decimal("5"), "seen": None}]
    events, deleted = _events(table, KeyRange(None, (8,)), source,
                              BinlogPosition(4, 1234, "mysql-bin.000004"),
                              replica=ReplicaSide(uri, schema, ["id"]))

    assert deleted == 2  # 2 and 4: live, in the range, not at the source; 3 is a tombstone
    assert [(e.op, e.key) for e in events] == [("r", (1,)), ("r", (5,)), ("d", (2,)),
                                               ("d", (4,))]
    for e in events:
        assert (e.position.lineage, e.position.file, e.position.pos, e.position.row) == (
            1, 4, 1234, 0)
        assert (e.topic, e.partition, e.offset) == ("", -1, -1)
        assert e.table == "shop.items" and e.key_columns == ("ID",)
        # The replica's types, so the apply types the values as the replica holds them.
        assert e.column_types == {"ID": "int", "price": "decimal(10,2)", "seen": "timestamp"}
    assert events[0].after == {"ID": 1, "price": Decimal("1.50"),
                               "seen": datetime(2026, 11, 2, 8)}
    assert events[0].before is None
    delete = events[2]
    assert delete.after is None
    assert delete.before == {"ID": 2, "price": Decimal("2.00"), "seen": datetime(2026, 11, 1, 9)}
