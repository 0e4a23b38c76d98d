"""SCD type 2 history on real Spark + Delta: versions by position, whatever the arrival."""

from __future__ import annotations

import pytest
from lake_events import MakeConfig, Partition, Source, row

from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.lakehouse.delta_log import open_log, table_location
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.orchestration.replica_reports import replica_table_metadata
from binlog_assets.orchestration.table_metadata import replica_definition_metadata


def test_history_orders_versions_by_position(spark, make_config: MakeConfig) -> None:
    pipeline = make_config([{"source": "shop.orders", "replica": "orders", "history": True}])
    db = pipeline.lakehouse.database
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = Source("shop.orders")
    one_a, one_b, one_late = row(1, note="a"), row(1, note="b"), row(1, note="late")
    c1 = src.insert(one_a)
    c3 = src.insert(row(3, note="three"))
    c2 = src.insert(row(2, note="two"))
    u1_late = src.update(one_a, one_late)  # happens here, arrives in the second batch
    u1 = src.update(one_late, one_b)
    d2 = src.delete(row(2, note="two"))
    truncate = src.truncate()
    c1_again = src.insert(row(1, note="again"))

    part.write(part.records([[c1], [c3], [c2], u1, [d2]]))
    builder.apply("orders")
    # The second batch: u1 again (a producer re-send), the late update, the truncate
    # twice (it closes key 3, untouched by this batch), a re-insert.
    part.write(part.records([u1, u1_late, [truncate], [c1_again], [truncate]]))
    builder.apply("orders")

    versions = spark.table(f"{db}.orders_history").orderBy("id", "_valid_from").collect()
    got = [(v["id"], v["note"], v["_op"], v["_valid_from"]["pos"],
            v["_valid_to"]["pos"] if v["_valid_to"] else None, v["_is_current"])
           for v in versions]
    pos = {name: e.position.pos for name, e in [
        ("c1", c1), ("c3", c3), ("c2", c2), ("u1_late", u1_late[0]), ("u1", u1[0]),
        ("d2", d2), ("t", truncate), ("c1_again", c1_again)]}
    assert got == [
        (None, None, "t", pos["t"], pos["t"], False),
        (1, "a", "c", pos["c1"], pos["u1_late"], False),
        (1, "late", "u", pos["u1_late"], pos["u1"], False),
        (1, "b", "u", pos["u1"], pos["t"], False),
        (1, "again", "c", pos["c1_again"], None, True),
        (2, "two", "c", pos["c2"], pos["d2"], False),
        (2, "two", "d", pos["d2"], pos["t"], False),
        (3, "three", "c", pos["c3"], pos["t"], False),
    ]
    # The current versions are the replica's live rows.
    current = {(r["id"], r["note"]) for r in
               spark.table(f"{db}.orders_history").where("_is_current").collect()}
    live = {(r["id"], r["note"]) for r in spark.table(f"{db}.orders_current").collect()}
    assert current == live == {(1, "again")}
    assert builder.apply("orders").skipped

    # The replica asset's metadata carries the history table's columns beside its own.
    md = replica_table_metadata(builder, "orders")
    history = {c.name: c.type for c in md["history_column_schema"].schema.columns}
    assert history == {f.name: f.dataType.simpleString()
                       for f in spark.table(f"{db}.orders_history").schema.fields}
    assert "_valid_to" in history and "_valid_to" not in {
        c.name for c in md["dagster/column_schema"].schema.columns}
    assert replica_definition_metadata(pipeline, "orders")["history_table"] == \
        f"{db}.orders_history"


def test_history_keeps_columns_named_like_its_working_columns(
        spark, make_config: MakeConfig) -> None:
    pipeline = make_config([{"source": "shop.orders", "replica": "orders", "history": True}])
    db = pipeline.lakehouse.database
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = Source("shop.orders", types={"id": "bigint", "_stored": "string", "_id": "string"})
    one = {"id": 1, "_stored": "s1", "_id": "i1"}
    two = {"id": 1, "_stored": "s2", "_id": "i2"}
    part.write(part.records([[src.insert(one)]]))
    builder.apply("orders")
    part.write(part.records([src.update(one, two)]))
    builder.apply("orders")

    versions = spark.table(f"{db}.orders_history").orderBy("_valid_from").collect()
    assert [(v["id"], v["_stored"], v["_id"], v["_is_current"]) for v in versions] == [
        (1, "s1", "i1", False), (1, "s2", "i2", True)]


# Spark's MERGE gives the same versions (`make test-long`): each way is held to them.
@pytest.mark.parametrize("by", ["delta-rs", pytest.param("spark", marks=pytest.mark.long)])
def test_a_small_batch_gives_the_history_spark_would(spark, make_config: MakeConfig,
                                                     by: str) -> None:
    """Small batches by Arrow (delta-rs, `history_arrow.py`), or all by Spark's
    MERGE (`arrow_commit_rows` 0): re-sent copies, a late update placed in its chain, a
    late change closed by a truncate stored before it, deletes and re-inserts."""
    pipeline = make_config([{"source": "shop.orders", "replica": "orders", "history": True}],
                           **({"arrow_commit_rows": 0} if by == "spark" else {}))
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = Source("shop.orders")
    one_a, one_b, one_late = row(1, note="a"), row(1, note="b"), row(1, note="late")
    c1, c3, c2 = src.insert(one_a), src.insert(row(3, note="three")), src.insert(row(2))
    u1_late = src.update(one_a, one_late)
    u1 = src.update(one_late, one_b)
    u3_late = src.update(row(3, note="three"), row(3, note="3b"))
    d2 = src.delete(row(2))
    truncate = src.truncate()
    c1_again, c4 = src.insert(row(1, note="again")), src.insert(row(4))
    for records in ([[c1], [c3], [c2], u1, [d2]], [[truncate]],
                    [u1, u1_late, [c1_again], [c4]], [u3_late, [c1_again]]):
        part.write(part.records(records))
        builder.apply("orders")

    table = (pipeline.lakehouse.database, "orders_history")
    merges = [h for h in open_log(table_location(spark, *table)).history()
              if h["operation"] == "MERGE"]
    # The truncate's batch is Spark's either way.
    assert {("clientVersion" in h and "delta-rs") or "spark" for h in merges} == (
        {"delta-rs", "spark"} if by == "delta-rs" else {"spark"})
    pos = {name: e.position.pos for name, e in [
        ("c1", c1), ("c3", c3), ("c2", c2), ("u1_late", u1_late[0]), ("u1", u1[0]),
        ("u3_late", u3_late[0]), ("d2", d2), ("t", truncate), ("c1_again", c1_again),
        ("c4", c4)]}
    versions = spark.table(".".join(table)).collect()
    got = sorted(((v["id"], v["note"], v["_op"], v["_valid_from"]["pos"],
                   v["_valid_to"]["pos"] if v["_valid_to"] else None, v["_is_current"])
                  for v in versions), key=repr)
    assert got == sorted([
        (None, None, "t", pos["t"], pos["t"], False),
        (1, "a", "c", pos["c1"], pos["u1_late"], False),
        (1, "late", "u", pos["u1_late"], pos["u1"], False),
        (1, "b", "u", pos["u1"], pos["t"], False),
        (1, "again", "c", pos["c1_again"], None, True),
        (2, "n", "c", pos["c2"], pos["d2"], False),
        (2, "n", "d", pos["d2"], pos["t"], False),
        (3, "three", "c", pos["c3"], pos["u3_late"], False),
        (3, "3b", "u", pos["u3_late"], pos["t"], False),
        (4, "n", "c", pos["c4"], None, True),
    ], key=repr)
    assert all(v["_source_ts"] is not None for v in versions if v["_op"] != "t")
