"""Every binlake table opens in delta-rs (what polars, DuckDB's delta reader and most
Python tools read with) and holds the rows Spark sees; the narrower table features are
an opt-in, and what they cost a reader is checked too."""

from __future__ import annotations

import pyarrow as pa
import pytest
from lake_events import MakeConfig, Partition, Source, row

from binlog_assets.identifiers import UnsafeIdentifierError
from binlog_assets.lakehouse.changelog import (
    ChangelogWriter,
    changelog_uri,
)
from binlog_assets.lakehouse.delta_log import delta_rs_uri, table_detail, table_location
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.lakehouse.replica.plan import FEATURE_PROPERTIES
from binlog_assets.orchestration.replica_reports import counted_rows


def _spark_rows(spark, name: str) -> list[tuple]:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    df = spark.table(name)
    df = df.select([F.unix_micros(F.col(f"`{f.name}`")).alias(f.name)
                    if isinstance(f.dataType, T.TimestampType) else F.col(f"`{f.name}`")
                    for f in df.schema.fields])
    return sorted((_plain(r.asDict(recursive=True)) for r in df.collect()), key=repr)


def _rs_rows(uri: str) -> list[tuple]:
    from deltalake import DeltaTable

    table = DeltaTable(delta_rs_uri(uri)).to_pyarrow_table()
    table = pa.table({name: (column.cast(pa.int64())
                             if pa.types.is_timestamp(column.type) else column)
                      for name, column in zip(table.column_names, table.columns,
                                              strict=True)})
    return sorted((_plain(r) for r in table.to_pylist()), key=repr)


def _plain(value):  # rows of either reader, in one shape
    if isinstance(value, dict):
        return tuple(sorted((k, _plain(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def _write_and_apply(spark, pipeline) -> tuple[ReplicaBuilder, str]:
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = Source("shop.orders")
    records = [[src.insert(row(i, amount=f"{i}.25", note=f"n{i}"))] for i in range(1, 6)]
    records += [src.update(row(2, note="n2"), row(2, amount="9.99", note="two")),
                [src.delete(row(3))]]
    part.write(part.records(records))
    builder.apply("orders")
    # The source widens a column and adds one: the replica follows (a rewrite, without
    # type widening), and stays readable.
    src.types = {**src.types, "qty": "bigint", "extra": "string"}
    part.write(part.records([[src.insert({**row(6, note="six"), "qty": 2**40,
                                          "extra": "x"})],
                             src.update(row(4), {**row(4, note="four"), "extra": "y"})]))
    builder.apply("orders")
    return builder, pipeline.lakehouse.database


def test_every_table_opens_in_delta_rs_with_the_rows_spark_sees(
        spark, make_config: MakeConfig) -> None:
    from deltalake import DeltaTable

    pipeline = make_config([{"source": "shop.orders", "replica": "orders", "history": True}])
    builder, db = _write_and_apply(spark, pipeline)
    tables = {f"{db}.{t}": table_location(spark, db, t) for t in ("orders", "orders_history")}
    tables[f"{db}.changelog"] = changelog_uri(pipeline)
    for name, uri in tables.items():
        protocol = DeltaTable(delta_rs_uri(uri)).protocol()
        assert not protocol.reader_features, (name, protocol)
        rows = _rs_rows(uri)
        assert rows == _spark_rows(spark, name), name
        assert rows, name
    live = {r["id"] for r in spark.table(f"{db}.orders_current").collect()}
    assert live == {1, 2, 4, 5, 6}
    # `_current` is a view over the replica: delta-rs readers filter its live rows.
    replica = DeltaTable(delta_rs_uri(tables[f"{db}.orders"])).to_pyarrow_table()
    assert {r["id"] for r in replica.to_pylist() if r["_op"] not in ("d", "t")} == live
    # The row-count check counts them so too, without Spark (its tombstone left out).
    assert counted_rows(builder, "orders", "primary_key") == len(live) < replica.num_rows


def test_narrower_features_are_an_opt_in_that_delta_rs_readers_refuse(
        spark, make_config: MakeConfig) -> None:
    from deltalake import DeltaTable

    pipeline = make_config([{"source": "shop.orders", "replica": "orders"}],
                         table_features=list(FEATURE_PROPERTIES))
    builder, db = _write_and_apply(spark, pipeline)
    properties = table_detail(spark, db, "orders")["properties"]
    assert {properties.get(k) for k, _ in FEATURE_PROPERTIES.values()} == {"true", "name"}
    uri = delta_rs_uri(table_location(spark, db, "orders"))
    with pytest.raises(Exception, match="not (yet )?supported"):
        DeltaTable(uri).to_pyarrow_table()
    # Spark reads it as before, and counts its live rows for the row-count check.
    assert {r["id"] for r in spark.table(f"{db}.orders_current").collect()} == {1, 2, 4, 5, 6}
    assert counted_rows(builder, "orders", "primary_key") == 5


def test_a_column_name_only_column_mapping_can_hold_is_named(
        spark, make_config: MakeConfig) -> None:
    types = {"id": "bigint", "unit price": "decimal(10,2)"}
    event = Source("shop.items", types=types).insert({"id": 1, "unit price": "2.50"})
    pipeline = make_config([{"source": "shop.items", "replica": "items"}])
    part = Partition(ChangelogWriter(pipeline))
    part.write(part.records([[event]]))
    with pytest.raises(UnsafeIdentifierError,
                       match=r"table 'lake_\w+\.items': column\(s\) \['unit price'\]"
                             r".*column_mapping"):
        ReplicaBuilder(spark, pipeline).apply("items")

    mapped = make_config([{"source": "shop.items", "replica": "items"}],
                         table_features=["column_mapping"])
    part = Partition(ChangelogWriter(mapped))
    part.write(part.records([[event]]))
    ReplicaBuilder(spark, mapped).apply("items")
    (got,) = spark.table(f"{mapped.lakehouse.database}.items_current").collect()
    assert str(got["unit price"]) == "2.50"


def test_a_location_lookup_runs_no_spark_job(spark, make_config: MakeConfig) -> None:
    """A new replica's apply looks its location up once; a filter on DESCRIBE's rows
    made that a Spark job of its own (half the lookup's time). The replica is written by
    Spark here: Delta's first look at a table whose last commit delta-rs wrote (no
    checksum file beside it) reconstructs its metadata in a job of its own."""
    from binlog_assets.lakehouse.delta_log import forget

    pipeline = make_config([{"source": "shop.orders", "replica": "orders"}],
                         arrow_commit_rows=0)
    _builder, db = _write_and_apply(spark, pipeline)
    forget(spark, db, "orders")
    context = spark.sparkContext
    context.setJobGroup("location-lookup", "location-lookup")
    try:
        location = table_location(spark, db, "orders")
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    assert location.endswith("/orders")
    assert context.statusTracker().getJobIdsForGroup("location-lookup") == []
