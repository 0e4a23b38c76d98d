"""Type widening and evolution plans (pure Python first), then each evolution mode on a
real replica."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

import pytest
from lake_events import TYPES, MakeConfig, Partition, Source, row
from pyspark.sql import types as T

from binlog_assets.formats.mysql_types import infer_type
from binlog_assets.identifiers import UnsafeIdentifierError
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.lakehouse.schema import (
    SchemaEvolutionError,
    plan_changes,
    spark_type,
    widen,
)

INT, BIGINT, DOUBLE, STRING = T.IntegerType(), T.LongType(), T.DoubleType(), T.StringType()


@pytest.mark.parametrize(("a", "b", "wide"), [
    (INT, BIGINT, BIGINT),
    (T.FloatType(), DOUBLE, DOUBLE),
    (INT, DOUBLE, DOUBLE),
    (T.DecimalType(10, 2), T.DecimalType(12, 4), T.DecimalType(12, 4)),
    (T.DecimalType(10, 2), T.DecimalType(5, 4), T.DecimalType(12, 4)),
    (T.DecimalType(10, 2), INT, T.DecimalType(12, 2)),
    (T.DecimalType(38, 2), T.DecimalType(38, 10), STRING),  # no decimal holds both
    (T.DateType(), T.TimestampType(), T.TimestampType()),
    (INT, STRING, STRING),
    (T.BooleanType(), INT, STRING),
])
def test_widen_is_symmetric_and_never_narrows(a, b, wide) -> None:
    assert widen(a, b) == wide
    assert widen(b, a) == wide


def test_canonical_names_map_to_spark_types() -> None:
    assert spark_type("decimal(20,0)") == T.DecimalType(20, 0)
    assert spark_type("json") == STRING
    assert spark_type("timestamp") == T.TimestampType()
    assert spark_type("geometry") == STRING  # unknown to binlake: kept as text


def test_inferred_types_of_decoded_values() -> None:
    assert [infer_type(v) for v in (True, 3, 2.5, Decimal("1.5"), datetime(2024, 1, 1),
                                    date(2024, 1, 1), b"x", {"a": 1}, "s", None)] == [
        "boolean", "bigint", "double", "decimal(38,18)", "timestamp", "date", "binary",
        "json", "string", None]


def test_evolve_adds_and_widens_but_never_drops() -> None:
    current = {"id": INT, "name": STRING, "gone": STRING}
    change = plan_changes(current, {"id": BIGINT, "Name": STRING, "age": INT}, {},
                          "evolve", "people")
    assert [(f.name, f.dataType) for f in change.add] == [("age", INT)]
    assert change.retype == [("id", INT, BIGINT)]
    assert change.columns == {"id": BIGINT, "name": STRING, "gone": STRING, "age": INT}


def test_inferred_types_only_add_columns() -> None:
    change = plan_changes({"price": T.DecimalType(10, 2)}, {}, {"price": DOUBLE, "x": BIGINT},
                          "evolve", "items")
    assert change.retype == []
    assert [f.name for f in change.add] == ["x"]


def test_exception_mode_names_every_change() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'people'.*'age' int.*'id' int -> bigint"):
        plan_changes({"id": INT}, {"id": BIGINT, "age": INT}, {}, "exception", "people")
    assert not plan_changes({"id": INT}, {"id": INT}, {}, "exception", "people")


def test_ignore_mode_keeps_the_schema() -> None:
    change = plan_changes({"id": INT}, {"id": BIGINT, "age": INT}, {}, "ignore", "people")
    assert not change and change.columns == {"id": INT}


@pytest.mark.parametrize("bad", ["_op", "_POSITION", "", "a\x00b", "x" * 200])
def test_unusable_column_names_are_refused(bad: str) -> None:
    with pytest.raises(UnsafeIdentifierError, match="'people'"):
        plan_changes({}, {bad: INT}, {}, "evolve", "people")


def test_columns_differing_only_in_case_are_refused() -> None:
    with pytest.raises(UnsafeIdentifierError, match="differ only in case"):
        plan_changes({}, {"Name": STRING}, {"name": STRING}, "evolve", "people")


# -- on real Spark + Delta -------------------------------------------------------------

def _schema(spark, pipeline, replica: str = "orders") -> dict[str, str]:
    table = spark.table(f"{pipeline.lakehouse.database}.{replica}")
    return {f.name: f.dataType.simpleString() for f in table.schema
            if not f.name.startswith("_")}


def test_evolve_follows_ddl_and_new_fields_and_drops_with_the_source(
        spark, make_config_each_path: MakeConfig) -> None:
    pipeline = make_config_each_path([{"source": "shop.orders", "replica": "orders"}])
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = Source("shop.orders")
    part.write(part.records([[src.insert(row(1, "1.00", "a", 5))]]))
    builder.apply("orders")

    # A DDL alone drives the change: a new column, int -> bigint, a wider decimal.
    wider = {**TYPES, "qty": "bigint", "amount": "decimal(12,3)", "color": "string"}
    part.write(part.records([[src.ddl(wider)]]))
    result = builder.apply("orders")
    assert result.schema_changes == ("add color string", "widen amount decimal(10,2) -> "
                                     "decimal(12,3)", "widen qty int -> bigint")
    assert _schema(spark, pipeline) == {"id": "bigint", "amount": "decimal(12,3)",
                                      "note": "string", "qty": "bigint", "color": "string"}

    # A field no declaration names, in an after-image: added with its value's type.
    fresh = {**row(2, "2.00", "b", 6), "color": "red", "extra": 42}
    part.write(part.records([[src.insert(fresh)]]))
    builder.apply("orders")
    assert _schema(spark, pipeline)["extra"] == "bigint"

    # A number becoming text is no in-place widening: the table is rewritten once. The
    # column `color` is dropped at the source (and `extra` is in no definition): under
    # `evolve` the replica drops them too.
    ddl = src.ddl({**{k: v for k, v in wider.items() if k != "color"}, "qty": "string"})
    third = {"id": 3, "amount": Decimal("3.000"), "note": "c", "qty": "three"}
    part.write(part.records([[ddl], [src.insert(third)]]))
    result = builder.apply("orders")
    assert {"drop column color", "drop column extra"} <= set(result.schema_changes), result
    assert _schema(spark, pipeline) == {"id": "bigint", "amount": "decimal(12,3)",
                                      "note": "string", "qty": "string"}
    rows = {r["id"]: r["qty"] for r in
            spark.table(f"{pipeline.lakehouse.database}.orders_current").collect()}
    assert rows == {1: "5", 2: "6", 3: "three"}


def test_exception_mode_stops_before_writing(spark, make_config_each_path: MakeConfig) -> None:
    pipeline = make_config_each_path([{"source": "shop.orders", "replica": "orders",
                           "schema_evolution": "exception"}])
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = Source("shop.orders")
    part.write(part.records([[src.insert(row(1))]]))
    applied = builder.apply("orders").applied_version
    src.types = {**TYPES, "color": "string"}
    part.write(part.records([[src.insert({**row(2), "color": "red"})]]))
    with pytest.raises(SchemaEvolutionError, match="'orders'.*new column 'color' string"):
        builder.apply("orders")
    assert "color" not in _schema(spark, pipeline)
    assert builder.applied_version("orders") == applied
    assert spark.table(f"{pipeline.lakehouse.database}.orders").count() == 1


def test_ignore_mode_applies_rows_without_new_columns(spark, make_config_each_path: MakeConfig
                                                      ) -> None:
    pipeline = make_config_each_path([{"source": "shop.orders", "replica": "orders",
                           "schema_evolution": "ignore"}])
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = Source("shop.orders")
    part.write(part.records([[src.insert(row(1))]]))
    builder.apply("orders")
    src.types = {**TYPES, "color": "string"}
    part.write(part.records([[src.insert({**row(2, "2.00", "b"), "color": "red"})]]))
    result = builder.apply("orders")
    assert result.schema_changes == () and result.written == 1
    assert "color" not in _schema(spark, pipeline)
    notes = {r["id"]: r["note"] for r in
             spark.table(f"{pipeline.lakehouse.database}.orders_current").collect()}
    assert notes == {1: "n", 2: "b"}


def test_column_adds_and_property_changes_commit_by_delta_rs_where_it_writes(
        spark, make_config: MakeConfig) -> None:
    """A new column and the replica's record of its source columns are metadata-only
    commits, which delta-rs makes where it writes the table (milliseconds, where Spark's
    ALTER is driver work); a table with an opt-in feature delta-rs does not write
    (column mapping) keeps them in Spark. Either way the replica takes the column."""
    from deltalake import DeltaTable

    from binlog_assets.lakehouse.delta_log import table_location

    for features, engine in (([], "delta-rs"), (["column_mapping"], "Apache-Spark")):
        pipeline = make_config([{"source": "shop.orders", "replica": "orders"}],
                               table_features=features)
        part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
        src = Source("shop.orders")
        part.write(part.records([[src.insert(row(1))]]))
        builder.apply("orders")
        log = DeltaTable(table_location(spark, pipeline.lakehouse.database, "orders"))
        before = log.version()
        part.write(part.records([[src.ddl({**TYPES, "color": "string"})],
                                 [src.insert({**row(2), "color": "red"})]]))
        assert builder.apply("orders").schema_changes == ("add color string",)
        log.update_incremental()
        made = {c["operation"]: c.get("clientVersion") or c.get("engineInfo") or ""
                for c in log.history() if c["version"] > before}
        adds = [by for op, by in made.items() if op.startswith("ADD COLUMN")]
        properties = [by for op, by in made.items() if op == "SET TBLPROPERTIES"]
        assert adds and properties, made
        assert all(by.startswith(engine) for by in adds + properties), made
        assert _schema(spark, pipeline)["color"] == "string"
        colors = {r["id"]: r["color"] for r in spark.table(
            f"{pipeline.lakehouse.database}.orders_current").collect()}
        assert colors == {1: None, 2: "red"}
