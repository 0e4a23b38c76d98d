"""The column expressions the replica and history MERGEs share: names and the position
struct without Spark; the expressions themselves on small DataFrames in the session's
Spark (no Delta tables)."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from binlog_assets.formats.event import Position
from binlog_assets.identifiers import UnsafeIdentifierError, check_column
from binlog_assets.lakehouse.changelog_rows import CHANGELOG_COLUMNS
from binlog_assets.lakehouse.columns import (
    POSITION_FIELDS,
    POSITION_TYPE,
    binlog_before_sql,
    change_identity,
    changelog_position,
    first_per_group,
    first_truncate_after,
    free_name,
    key_match,
    position_literal,
    split_table,
    working_column,
)

_SPARK_TYPE = {"int": T.IntegerType(), "bigint": T.LongType()}


def test_the_position_struct_is_the_binlog_position_then_the_kafka_tie_breakers() -> None:
    names = [name for name, _, _ in POSITION_FIELDS]
    # The struct keeps the name `phase` for the lineage, which replicas made before
    # lineages already hold: a renamed struct field would mean rewriting every table.
    assert Position._fields == ("lineage", "file", "pos", "row")
    assert names == ["phase", *Position._fields[1:], "offset", "row_index"]
    assert POSITION_TYPE.fieldNames() == names
    changelog = dict(CHANGELOG_COLUMNS)
    # Each field is read from a changelog column of the same width.
    assert [(source, _SPARK_TYPE[changelog[source]]) for _, _, source in POSITION_FIELDS] \
        == [(source, t) for _, t, source in POSITION_FIELDS]


@pytest.mark.parametrize(("name", "parts"), [
    ("shop.orders", ("shop", "orders")),
    ("shop_1.orders.v2", ("shop_1", "orders.v2")),  # a table name may hold a dot
    ("orders", ("orders", "")),
])
def test_split_table(name: str, parts: tuple[str, str]) -> None:
    assert split_table(name) == parts


def test_free_name_avoids_every_column_whatever_its_case() -> None:
    assert free_name("_rank", ["id", "name"]) == "_rank"
    assert free_name("_rank", ["id", "_RANK", "_Rank_"]) == "_rank__"


def test_no_source_column_can_be_called_like_a_working_column() -> None:
    assert working_column("after") == "\x1fafter"
    with pytest.raises(UnsafeIdentifierError, match="control character"):
        check_column(working_column("after"), "shop.orders")


@pytest.fixture
def positions(spark):  # the session's Spark, a DataFrame
    """Changelog-shaped rows: `id`, the position columns, and where each came from."""
    rows = [
        # id, phase, file, pos, row, offset, row_index
        (1, 1, 9, 900, 0, 10, 0),
        (2, 1, 10, 4, 0, 11, 0),     # file 10 after file 9 (numbers, not text)
        (3, 0, 99, 999, 0, 12, 0),   # a snapshot read, below every streamed change
        (4, 1, 10, 4, 0, 57, 0),     # id 2's change sent again: a new Kafka offset
        (5, 1, 0, 0, 0, 13, 0),      # a source without coordinates (Canal)
        (6, 1, 0, 0, 0, 14, 0),
    ]
    schema = "id int, pos_phase int, pos_file bigint, pos_pos bigint, pos_row int, " \
             "offset bigint, row_index int"
    return spark.createDataFrame(rows, schema).withColumn("p", changelog_position())


def test_positions_order_as_numbers_and_snapshots_first(positions) -> None:
    order = [r["id"] for r in positions.orderBy("p").collect()]
    assert order == [3, 5, 6, 1, 2, 4]
    [row] = positions.where(F.col("id") == 2).select(
        (F.col("p") > position_literal((1, 9, 900, 0, 10, 0))).alias("later"),
        (F.col("p") == position_literal((1, 10, 4, 0, 11, 0))).alias("same")).collect()
    assert (row["later"], row["same"]) == (True, True)
    assert positions.schema["p"].dataType == POSITION_TYPE


def test_a_change_sent_twice_is_one_change_unless_it_has_no_coordinates(
        positions) -> None:
    identities = positions.groupBy(change_identity(F.col("p")).alias("c")).agg(
        F.sort_array(F.collect_list("id")).alias("ids"))
    assert sorted(r["ids"] for r in identities.collect()) == [[1], [2, 4], [3], [5], [6]]


def test_key_match_is_null_safe(spark) -> None:
    schema = "k1 int, k2 string, v int"
    target = spark.createDataFrame([(1, "a", 10), (None, None, 20), (2, None, 30)], schema)
    source = spark.createDataFrame([(1, "a", 1), (None, None, 2), (2, "b", 3)], schema)
    joined = target.alias("t").join(source.alias("s"), key_match(["k1", "k2"]))
    assert sorted((r[2], r[5]) for r in joined.collect()) == [(10, 1), (20, 2)]


def test_first_per_group_keeps_the_first_row_of_each_key_nulls_together(
        spark) -> None:
    frame = spark.createDataFrame(
        [(1, 5, "old"), (1, 7, "new"), (None, 3, "t1"), (None, 9, "t2"), (2, 1, "only")],
        "k int, at int, _rank string")  # `_rank` is a source column: not overwritten
    first = first_per_group(frame, [F.col("k")], [F.col("at").desc()])
    assert first.columns == ["k", "at", "_rank"]
    assert sorted(first.collect(), key=lambda r: r["at"]) == [
        (2, 1, "only"), (1, 7, "new"), (None, 9, "t2")]


def test_first_truncate_after_names_the_tables_next_truncate(spark) -> None:
    truncates = [("shop.a", (1, 9, 0, 0, 0, 0)), ("shop.a", (1, 5, 0, 0, 0, 0)),
                 ("shop.b", (1, 3, 0, 0, 0, 0))]
    rows = spark.createDataFrame(
        [(1, "shop", "a", 4), (2, "shop", "a", 6), (3, "shop", "a", 10),
         (4, "shop", "b", 1), (5, "shop", "c", 1)],
        "id int, _source_db string, _source_table string, file bigint",
    ).withColumn("p", position_literal((1, 0, 0, 0, 0, 0)).withField("file", F.col("file")))
    found = {r["id"]: r["t"] for r in rows.select(
        "id", first_truncate_after(truncates, F.col("p")).alias("t")).collect()}
    assert {i: None if t is None else t["file"] for i, t in found.items()} == {
        1: 5, 2: 9, 3: None, 4: 3, 5: None}
    [none] = rows.select(first_truncate_after([], F.col("p")).alias("t")).limit(1).collect()
    assert none["t"] is None
    assert rows.select(first_truncate_after([], F.col("p")).alias("t")).schema["t"] \
        .dataType == POSITION_TYPE


def test_older_than_a_ddl_goes_by_binlog_coordinates_whatever_the_phase(spark) -> None:
    add = (1, 2, 100, 0, 40, 0)  # a streamed ALTER at binlog file 2, pos 100
    rows = {
        "initial snapshot": ((0, 1, 50, 0, 3, 0), True),
        "streamed before": ((1, 2, 99, 0, 90, 0), True),
        "streamed after": ((1, 2, 101, 0, 1, 0), False),
        "next file": ((1, 3, 4, 0, 2, 0), False),
        # An incremental snapshot read after the ALTER carries the binlog position then.
        "incremental snapshot": ((0, 2, 500, 0, 7, 0), False),
    }
    frame = spark.createDataFrame([(name, position) for name, (position, _) in rows.items()],
                                  T.StructType([T.StructField("name", T.StringType()),
                                                T.StructField("_position", POSITION_TYPE)]))
    got = {r["name"]: r["older"] for r in frame.select(
        "name", F.expr(binlog_before_sql(add)).alias("older")).collect()}
    assert got == {name: older for name, (_, older) in rows.items()}
    # Without coordinates (a source that gives none) the whole position decides.
    bare = {r["o"]: r["older"] for r in spark.createDataFrame(
        [((1, 0, 0, 0, o, 0),) for o in (5, 15)],
        T.StructType([T.StructField("_position", POSITION_TYPE)])).select(
        F.col("_position.offset").alias("o"),
        F.expr(binlog_before_sql((1, 0, 0, 0, 10, 0))).alias("older")).collect()}
    assert bare == {5: True, 15: False}
