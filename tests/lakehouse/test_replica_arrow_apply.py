"""Applies reduced and typed as Arrow: each value as Spark's cast gives it, the same
replica as Spark's apply, no Spark read of the changelog, and Spark's way for what the
driver does not reproduce."""

from __future__ import annotations

import base64
import struct
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import orjson
import pytest
from lake_events import MakeConfig, Partition, Source
from pyspark.sql import functions as F
from pyspark.sql import types as T

from binlog_assets.config import PipelineConfig
from binlog_assets.formats.base import snapshot_end
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.lakehouse.changelog_arrow import changes_of
from binlog_assets.lakehouse.replica import builder as replica_module
from binlog_assets.lakehouse.replica.arrow_apply import NeedsSpark, converter
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.lakehouse.replica.plan import ROW_OPS
from binlog_assets.lakehouse.replica.rows import cast_text, text_schema

# (Spark type, JSON-decoded values the driver types); Spark's cast of each value's JSON
# text must give the same.
ACCEPTED: list[tuple[T.DataType, list[Any]]] = [
    (T.IntegerType(), [0, -5, 2**31 - 1, -(2**31), "42", "-7", "+3", "007"]),
    (T.LongType(), [2**63 - 1, -(2**63), "123", 5]),
    (T.DoubleType(), [1.5, 1e20, -0.0, 3, 1e-7, 2**60 + 1, 123456789.123456789]),
    (T.FloatType(), [1.1, 3.4e38, 0.1, 7, 16777217]),
    (T.DecimalType(10, 2), ["1.005", "-1.005", "123.4", "0", "1E+2", 5, "12345678.994",
                            ".5", "-0.001", "1.", "99999999.99"]),
    (T.DecimalType(38, 10), ["1234567890123456789012345678.1234567890",
                             "-0.00000000005"]),
    (T.BooleanType(), [True, False, "true", "YES", "0", 1, 0, "t", "N", "False"]),
    (T.StringType(), ["plain", "ünïcödé ✓", "line\nbreak\ttab\\", True, 42, -3,
                      {"a": [1, "x", None, True], "b": {"c": "q\"uote"}}, [1, 2], [],
                      {"k": "é\r\n"}]),
    (T.DateType(), ["2024-02-29", "1999-12-31T23:59:59", "2024-01-01 10:00:00",
                    "0001-01-01", "9999-12-31"]),
    (T.TimestampType(), ["2024-01-02T03:04:05", "2024-01-02T03:04:05.123456",
                         "2024-01-02T03:04:05.5", "2024-01-02 03:04:05+05:30",
                         "2024-01-02T03:04:05Z", "2024-01-02T03:04:05-08:00", "2024-01-02",
                         "1969-12-31T23:59:59.999999", "2024-01-02T03:04:05.000100+00:00"]),
    (T.BinaryType(), [base64.b64encode(b"\x00\xffabc").decode(), ""]),
]

REFUSED: list[tuple[T.DataType, list[Any]]] = [
    (T.IntegerType(), [1.5, True, "1.0", 2**31, " 1", "x", {"a": 1}]),
    (T.LongType(), [2**63, "1e3"]),
    (T.DoubleType(), ["1.5", True, "NaN", [1.0]]),
    (T.DecimalType(10, 2), [1.5, "abc", "NaN", "1_000", "100000000", "99999999.995",
                            True, "Infinity"]),
    (T.BooleanType(), ["maybe", 2, 1.0, ""]),
    (T.StringType(), [1.5, {"a": 1.5}, ["\x01"], {"\x1f": 1}]),
    (T.DateType(), ["2024-13-01", "20240101", 5, "2024-02-30", "0000-01-01"]),
    (T.TimestampType(), ["2024-01-02T03:04", "bad", "2024-01-02T25:00:00", 1700000000,
                         "2024-01-02T03:04:05.1234567", "0001-01-01T00:00:00+01:00"]),
    (T.BinaryType(), ["!!", 5, "abc"]),
]


def _name(data_type: T.DataType, value: Any) -> str:
    return f"{data_type.simpleString()}:{value!r}"


@pytest.mark.parametrize(("data_type", "value"), [
    (t, v) for t, values in REFUSED for v in values], ids=lambda x: repr(x)[:30])
def test_values_the_driver_cannot_type_as_spark_does_send_the_batch_to_spark(
        data_type: T.DataType, value: Any) -> None:
    with pytest.raises(NeedsSpark):
        converter(data_type)(value)


def test_each_value_the_driver_types_equals_sparks_cast_of_its_text(spark) -> None:
    cases = [(t, v) for t, values in ACCEPTED for v in values]
    texts = [(i, orjson.dumps({"v": v}).decode()) for i, (_, v) in enumerate(cases)]
    frame = spark.createDataFrame(texts, "i int, image string")
    parsed = F.from_json(F.col("image"), text_schema({"v": ["v"]})).getField("v")
    columns = [F.col("i")]
    for i, (data_type, _) in enumerate(cases):
        value = cast_text(parsed, data_type)
        if isinstance(data_type, T.TimestampType):
            value = F.unix_micros(value)  # collect() would turn it into local time
        columns.append(F.when(F.col("i") == i, value).alias(f"c{i}"))
    spark_values = {r["i"]: r[f"c{r['i']}"] for r in frame.select(*columns).collect()}

    for i, (data_type, value) in enumerate(cases):
        ours = converter(data_type)(value)
        if isinstance(data_type, T.TimestampType):
            ours = (ours - datetime(1970, 1, 1, tzinfo=UTC)) // _MICROSECOND
        elif isinstance(data_type, T.FloatType):
            ours = struct.unpack("f", struct.pack("f", ours))[0]
        theirs = spark_values[i]
        if isinstance(theirs, bytearray):
            theirs = bytes(theirs)
        assert (type(ours), ours) == (type(theirs), theirs), _name(data_type, value)


_MICROSECOND = datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)

TYPES = {"id": "bigint", "i": "int", "d": "double", "f": "float", "m": "decimal(10,2)",
         "b": "boolean", "s": "string", "j": "json", "dt": "date", "ts": "timestamp",
         "bin": "binary"}


def _row(id_: int, n: int, **extra: Any) -> dict[str, Any]:
    return {"id": id_, "i": n - 3, "d": n / 7, "f": n * 1.1, "m": Decimal(f"{n}.{n % 100:02d}"),
            "b": n % 2 == 0, "s": f"ünï {n}\n", "j": {"n": n, "tags": ["a", str(n)]},
            "dt": date(2024, 1 + n % 12, 1 + n % 28),
            "ts": datetime(2024, 1, 2, 3, 4, n % 60, n * 1000),
            "bin": bytes([n % 256, 0, 255]), **extra}


def _batches(source: Source) -> list[list]:
    first = [[source.insert(_row(i, i))] for i in range(1, 9)]
    second = ([source.update(_row(i, i), _row(i, i + 50)) for i in (2, 3, 3)]
              + [[source.delete(_row(4, 4))], [source.insert(_row(20, 20))]])
    # A row with nulls everywhere but its key, and one changed twice in one batch.
    second += [[source.insert({"id": 21})], source.update(_row(5, 5), _row(5, 77))]
    return [first, second]


def _content(spark, pipeline: PipelineConfig) -> list[tuple]:
    frame = spark.table(f"{pipeline.lakehouse.database}.wide").drop("_applied_at")
    frame = frame.withColumn("ts", F.unix_micros("ts")).withColumn(
        "_source_ts", F.unix_micros("_source_ts"))
    return sorted(tuple(r) for r in frame.collect())


def _build(spark, pipeline: PipelineConfig, batches: list[list]) -> list:
    part = Partition(ChangelogWriter(pipeline))
    builder = ReplicaBuilder(spark, pipeline)
    results = []
    for batch in batches:
        part.write(part.records(batch))
        results.append(builder.apply("wide"))
    return results


WIDE = [{"source": "shop.wide", "replica": "wide"}]


def test_a_driver_apply_gives_the_replica_sparks_apply_gives_without_a_spark_read(
        spark, make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    spark_config = make_config(WIDE, arrow_commit_rows=0)
    spark_results = _build(spark, spark_config, _batches(Source("shop.wide", dict(TYPES))))

    def no_spark_read(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an Arrow apply planned a Spark read of the changelog")

    monkeypatch.setattr(replica_module, "read_changelog", no_spark_read)
    driver_config = make_config(WIDE)
    driver_results = _build(spark, driver_config, _batches(Source("shop.wide", dict(TYPES))))

    assert _content(spark, driver_config) == _content(spark, spark_config)
    assert len(_content(spark, driver_config)) == 10  # 9 rows and a tombstone
    for ours, theirs in zip(driver_results, spark_results, strict=True):
        assert (ours.rows, ours.upserts, ours.deletes, ours.written, ours.applied_version,
                ours.last_source_ts) == (
            theirs.rows, theirs.upserts, theirs.deletes, theirs.written,
            theirs.applied_version, theirs.last_source_ts)
    # The newest source commit of each batch: one more statement each (Source's clock).
    assert [r.last_source_ts for r in driver_results] == [
        1_700_000_000_000 + 95 + 8, 1_700_000_000_000 + 95 + 8 + 7]
    # The view of live rows is there for a replica the driver created.
    assert spark.table(f"{driver_config.lakehouse.database}.wide_current").count() == 9


def test_a_value_the_driver_does_not_type_sends_the_whole_batch_to_spark(
        spark, make_config: MakeConfig) -> None:
    # A float in a text column: Spark writes it as Java does (1.0E20).
    batches = [[[Source("shop.wide", {"id": "bigint", "s": "string"}).insert(
        {"id": 1, "s": 1e20})]]]
    spark_config = make_config(WIDE, arrow_commit_rows=0)
    driver_config = make_config(WIDE)
    _build(spark, spark_config, batches)
    _build(spark, driver_config, batches)
    assert _content_of(spark, driver_config) == _content_of(spark, spark_config) == [
        (1, "1.0E20")]


def _content_of(spark, pipeline: PipelineConfig) -> list[tuple]:
    return sorted(tuple(r) for r in spark.table(
        f"{pipeline.lakehouse.database}.wide").select("id", "s").collect())


def test_a_changelog_range_is_read_once_and_extended_for_the_next_cycle(
        make_config: MakeConfig) -> None:
    pipeline = make_config(WIDE)
    orders, users = Source("shop.orders"), Source("shop.users")
    part = Partition(ChangelogWriter(pipeline))
    for i in range(1, 4):
        part.write(part.records([[orders.insert({"id": i})], [users.insert({"id": i})]]))
    # Versions 1-3 hold one commit each (version 0 made the table).
    offsets = lambda rows: sorted(rows.column("offset").to_pylist())  # noqa: E731
    assert offsets(changes_of(pipeline, 0, 3, ["shop.orders"], ROW_OPS)) == [0, 2, 4]
    assert offsets(changes_of(pipeline, 1, 3, ["shop.users"], ROW_OPS)) == [3, 5]
    part.write(part.records([[orders.insert({"id": 9})]]))
    assert offsets(changes_of(pipeline, 3, 4, ["shop.orders"], ROW_OPS)) == [6]
    assert offsets(changes_of(pipeline, 2, 4, ["shop.orders", "shop.users"], ROW_OPS)) == [4, 5, 6]
    assert offsets(changes_of(pipeline, None, 4, ["shop.orders"], ROW_OPS)) == [0, 2, 4, 6]


def test_a_new_replica_built_from_a_snapshot_is_built_in_the_driver(
        spark, make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    # A snapshot ends with a truncate just below its rows, so a replica's first batch
    # holds one: the driver drops what lies below it and writes its marker, as Spark
    # does, and a change from below the marker that arrives later is dropped too.
    types = {"id": "bigint", "s": "string"}

    def batches(src: Source) -> list[list]:
        gone = src.insert({"id": 9, "s": "gone"})  # deleted before the snapshot read
        late = src.insert({"id": 8, "s": "late"})  # the same, delivered after the build
        src.pos += 10
        read = [src.snapshot({"id": i, "s": "read"}) for i in (1, 2, 3)]
        after = src.insert({"id": 5, "s": "after"})
        return [[[gone], read, [snapshot_end(read[-1])], [after]], [[late]],
                [src.update({"id": 2, "s": "read"}, {"id": 2, "s": "changed"})]]

    spark_config = make_config(WIDE, arrow_commit_rows=0)
    _build(spark, spark_config, batches(Source("shop.wide", types)))

    def no_spark_read(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the build of a new replica planned a Spark read")

    monkeypatch.setattr(replica_module, "read_changelog", no_spark_read)
    driver_config = make_config(WIDE)
    results = _build(spark, driver_config, batches(Source("shop.wide", types)))

    def rows(pipeline: PipelineConfig) -> list[tuple]:
        return sorted((tuple(r) for r in spark.table(f"{pipeline.lakehouse.database}.wide")
                       .select("_op", "id", "s", "_position", "_source_ts").collect()),
                      key=repr)

    assert rows(driver_config) == rows(spark_config)
    assert sorted(r[1:3] for r in rows(driver_config) if r[0] != "t") == [
        (1, "read"), (2, "changed"), (3, "read"), (5, "after")]
    assert [r[:3] for r in rows(driver_config) if r[0] == "t"] == [("t", None, None)]
    assert [r.written for r in results] == [5, 0, 1]


def test_a_replica_holding_a_truncate_applies_small_batches_in_the_driver(
        spark, make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    # A snapshot ends with a truncate, so every replica built from one holds a marker:
    # its later small batches stay in the driver, and a change from below the marker
    # that arrives late is dropped there as Spark's apply drops it.
    types = {"id": "bigint", "s": "string"}

    def batches(src: Source) -> tuple[list, list]:
        early = [[src.insert({"id": i, "s": "early"})] for i in (1, 2, 3)]
        late = src.insert({"id": 4, "s": "late"})  # before the truncate, delivered after
        truncate = src.truncate()
        after = src.insert({"id": 5, "s": "after"})
        first = [early, [[truncate], [after]]]
        rest = [[[late]], [src.update({"id": 5, "s": "after"}, {"id": 5, "s": "changed"})]]
        return first, rest

    spark_config = make_config(WIDE, arrow_commit_rows=0)
    first, rest = batches(Source("shop.wide", types))
    _build(spark, spark_config, first + rest)

    driver_config = make_config(WIDE)
    first, rest = batches(Source("shop.wide", types))
    part = Partition(ChangelogWriter(driver_config))
    builder = ReplicaBuilder(spark, driver_config)
    for batch in first:
        part.write(part.records(batch))
        builder.apply("wide")

    def no_spark_read(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an apply into a truncated replica planned a Spark read")

    monkeypatch.setattr(replica_module, "read_changelog", no_spark_read)
    written = []
    for batch in rest:
        part.write(part.records(batch))
        written.append(builder.apply("wide").written)

    assert written == [0, 1]

    def rows(pipeline: PipelineConfig) -> list[tuple]:
        return sorted((tuple(r) for r in spark.table(f"{pipeline.lakehouse.database}.wide")
                       .select("_op", "id", "s", "_position").collect()), key=repr)

    assert rows(driver_config) == rows(spark_config)
    assert [r[:3] for r in rows(driver_config)] == [("t", None, None), ("u", 5, "changed")]
