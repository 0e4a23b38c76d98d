"""Rows of a table renamed within its replica (both names feed it), on real Spark +
Delta: whether the rows were applied before the rename or arrive in the same batch."""

from __future__ import annotations

import pytest
from lake_events import TYPES, MakeConfig, Partition, Source, row

from binlog_assets.formats.event import ChangeEvent
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder


def rename(src: Source, old: str, new: str) -> ChangeEvent:
    return ChangeEvent(f"shop.{new}", "ddl", (), ("id",), None, None, src._next(),
                       1_700_000_000_000, ddl=f"RENAME TABLE {old} TO {new}",
                       column_types=dict(TYPES))


@pytest.mark.parametrize("applied", ["before", "one-batch", "new-replica"])
def test_rows_of_a_renamed_table_move_to_its_new_name(
        spark, make_config_each_path: MakeConfig, applied: str) -> None:
    pipeline = make_config_each_path([{"source": r"shop\.items(_v2)?", "replica": "items"}])
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = Source("shop.items")
    part.write(part.records([[src.insert(row(1, note="a"))]]))
    if applied != "new-replica":
        builder.apply("items")  # the replica exists
    part.write(part.records([[src.insert(row(i, note="abc"[i - 1]))] for i in (2, 3)]))
    if applied == "before":
        builder.apply("items")
    moved = rename(src, "items", "items_v2")
    src.table = "shop.items_v2"
    part.write(part.records([[moved], src.update(row(2, note="b"), row(2, note="b2"))]))
    result = builder.apply("items")
    if applied != "new-replica":  # a new replica is built as its tables are now
        assert "move rows shop.items -> shop.items_v2" in result.schema_changes, result
    rows = spark.table(f"{pipeline.lakehouse.database}.items_current").collect()
    assert sorted((r["_source_table"], r["id"], r["note"]) for r in rows) == [
        ("items_v2", 1, "a"), ("items_v2", 2, "b2"), ("items_v2", 3, "c")]
