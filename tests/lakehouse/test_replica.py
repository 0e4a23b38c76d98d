"""Replica builds on real Spark + Delta: idempotency, tombstones, truncates, key changes,
routing and hostile names. (The randomized reference-model test is test_replica_model.)"""

from __future__ import annotations

import re
import time
from decimal import Decimal

import pytest
from lake_events import MakeConfig, Partition, Source, live_rows, row

from binlog_assets.config import PipelineConfig
from binlog_assets.formats.event import ChangeEvent, Position
from binlog_assets.identifiers import UnsafeIdentifierError
from binlog_assets.lakehouse.changelog import ChangelogWriter, PartitionWrite
from binlog_assets.lakehouse.changelog_reader import changelog_version, register_changelog
from binlog_assets.lakehouse.delta_log import known_views, open_log, table_location
from binlog_assets.lakehouse.maintenance import PURGED_PROPERTY
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder

ORDERS = [{"source": "shop.orders", "replica": "orders"}]


def live(spark, pipeline: PipelineConfig, replica: str = "orders",
         columns: tuple[str, ...] = ("id", "amount", "note"), *, view: bool = False) -> dict:
    """The replica's live rows: key -> the other `columns`; read by delta-rs, or through
    Spark's `_current` view with `view`."""
    rows = (spark.table(f"{pipeline.lakehouse.database}.{replica}_current").collect()
            if view else live_rows(spark, pipeline, replica))
    return {r[columns[0]]: tuple(r[c] for c in columns[1:]) for r in rows}


def content(spark, pipeline: PipelineConfig, replica: str = "orders") -> list[tuple]:
    """Every row of the replica table, every column (metadata included), sorted."""
    return sorted(tuple(r) for r in
                  spark.table(f"{pipeline.lakehouse.database}.{replica}").collect())


def setup(spark, pipeline: PipelineConfig) -> tuple[Partition, ReplicaBuilder]:
    return Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)


def test_reapplying_an_applied_range_leaves_the_replica_identical(
        spark, make_config_each_path: MakeConfig) -> None:
    pipeline = make_config_each_path(ORDERS)
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders")
    a, b = row(1, "1.00", "a"), row(2, "2.00", "b")
    events = part.records([[src.insert(a)], [src.insert(b)], src.update(a, row(1, "1.50", "a2")),
                           [src.delete(b)]])
    part.write(events)
    first = builder.apply("orders")
    assert (first.rows, first.upserts, first.deletes, first.written) == (4, 3, 1, 2)
    before = content(spark, pipeline)

    again = builder.apply("orders")
    assert again.skipped and again.applied_version == first.applied_version
    # The same changes land in bronze a second time (another consumer group re-read the
    # topic): new changelog rows, same positions. The guard leaves every byte in place.
    part.writer.write(PartitionWrite(events, None, group_id="second-group", topic="binlog",
                                     partition=0, end_offset=part.end))
    replay = builder.apply("orders")
    assert replay.applied_version == first.applied_version + 1
    assert (replay.rows, replay.written) == (4, 0)
    assert content(spark, pipeline) == before
    assert builder.apply("orders", up_to_version=first.applied_version).skipped
    assert live(spark, pipeline) == {1: (Decimal("1.50"), "a2")}


def test_late_older_update_cannot_resurrect_a_deleted_row(spark, make_config_each_path: MakeConfig
                                                          ) -> None:
    pipeline = make_config_each_path(ORDERS)
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders")
    a = row(1, "1.00", "a")
    created = src.insert(a)
    late = src.update(a, row(1, "9.99", "late"))  # happened before the delete...
    deleted = src.delete(row(1, "9.99", "late"))
    part.write(part.records([[created], [deleted]]))
    builder.apply("orders")
    part.write(part.records([late]))  # ...but arrives after it
    result = builder.apply("orders")
    assert (result.upserts, result.written) == (1, 0)
    assert live(spark, pipeline) == {}
    (tomb,) = spark.table(f"{pipeline.lakehouse.database}.orders").collect()
    assert tomb["_op"] == "d" and tomb["_position"]["pos"] == deleted.position.pos


def test_tombstones_are_purged_after_the_window(spark, make_config_each_path: MakeConfig) -> None:
    pipeline = make_config_each_path(ORDERS, retention_hours=1 / 3600)  # one second
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders")
    part.write(part.records([[src.insert(row(1))], [src.delete(row(1))]]))
    assert builder.apply("orders").tombstones == 0
    assert spark.table(f"{pipeline.lakehouse.database}.orders").where("_op = 'd'").count() == 1
    time.sleep(1.5)
    part.write(part.records([[src.insert(row(2))]]))
    assert builder.apply("orders").tombstones == 1
    assert [r["id"] for r in spark.table(f"{pipeline.lakehouse.database}.orders").collect()] == [2]
    # Purged by delta-rs, no Spark DELETE: the delete, then the purge time.
    log = open_log(table_location(spark, pipeline.lakehouse.database, "orders"))
    purge = log.history(2)
    assert [(h["operation"], "clientVersion" in h) for h in purge] == [
        ("SET TBLPROPERTIES", True), ("DELETE", True)]
    assert float(log.metadata().configuration[PURGED_PROPERTY]) > 0


# Spark's DELETE, kept for the features delta-rs does not write: the same purge.
@pytest.mark.long
def test_tombstones_of_a_table_with_deletion_vectors_are_purged_by_spark(
        spark, make_config: MakeConfig) -> None:
    pipeline = make_config(ORDERS, retention_hours=1 / 3600, table_features=["deletion_vectors"])
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders")
    part.write(part.records([[src.insert(row(1))], [src.insert(row(3))], [src.delete(row(1))]]))
    assert builder.apply("orders").tombstones == 0
    time.sleep(1.5)
    part.write(part.records([[src.insert(row(2))]]))
    assert builder.apply("orders").tombstones == 1
    table = spark.table(f"{pipeline.lakehouse.database}.orders")
    assert sorted(r["id"] for r in table.collect()) == [2, 3]
    log = open_log(table_location(spark, pipeline.lakehouse.database, "orders"))
    assert [(h["operation"], "engineInfo" in h) for h in log.history(2)] == [
        ("SET TBLPROPERTIES", True), ("DELETE", True)]


def test_truncate_clears_older_rows_and_drops_later_arriving_older_changes(
        spark, make_config_each_path: MakeConfig) -> None:
    pipeline = make_config_each_path(ORDERS)
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders")
    early = [[src.insert(row(i))] for i in (1, 2, 3)]
    late_insert = src.insert(row(4))  # before the truncate, delivered after it
    truncate = src.truncate()
    after = src.insert(row(5, "5.00", "after"))
    newer_than_truncate = src.insert(row(6, "6.00", "early bird"))
    # Row 6 arrives before the truncate it follows: the truncate must not remove it.
    part.write(part.records([*early, [newer_than_truncate]]))
    builder.apply("orders")
    part.write(part.records([[truncate], [after]]))
    result = builder.apply("orders")
    assert result.truncated == 3
    assert set(live(spark, pipeline)) == {5, 6}
    part.write(part.records([[late_insert]]))
    builder.apply("orders")
    assert set(live(spark, pipeline)) == {5, 6}
    markers = spark.table(f"{pipeline.lakehouse.database}.orders").where("_op = 't'").collect()
    assert [(m["id"], m["_position"]["pos"]) for m in markers] == [(None,
                                                                    truncate.position.pos)]


def test_primary_key_change_deletes_the_old_key(spark, make_config_each_path: MakeConfig) -> None:
    pipeline = make_config_each_path(ORDERS)
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders")
    a = row(1, "1.00", "a")
    part.write(part.records([[src.insert(a)], src.update(a, {**a, "id": 11})]))
    builder.apply("orders")
    assert live(spark, pipeline) == {11: (Decimal("1.00"), "a")}


def test_key_override_handles_a_key_change_the_decoder_did_not_split(
        spark, make_config_each_path: MakeConfig) -> None:
    pipeline = make_config_each_path([{"source": "shop.orders", "replica": "orders",
                           "key_columns": ["note"]}])
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders")  # events keyed by id, as the decoder saw them
    a = row(1, "1.00", "old-no")
    moved = row(1, "1.00", "new-no")
    part.write(part.records([[src.insert(a)], src.update(a, moved)]))
    builder.apply("orders")
    assert live(spark, pipeline, columns=("note", "id")) == {"new-no": (1,)}


def test_shards_with_equal_ids_stay_apart(spark, make_config_each_path: MakeConfig) -> None:
    pipeline = make_config_each_path([{"source": r"shop_\d+\.orders", "replica": "orders"}])
    part, builder = setup(spark, pipeline)
    one, two, other = Source("shop_1.orders"), Source("shop_2.orders"), Source("shop_1.items")
    part.write(part.records([[one.insert(row(7, "1.00", "one"))],
                             [two.insert(row(7, "2.00", "two"))],
                             [other.insert(row(7, "3.00", "item"))],
                             [two.delete(row(7, "2.00", "two"))],
                             [two.insert(row(7, "2.50", "two again"))]]))
    result = builder.apply("orders")
    assert result.rows == 4
    rows = spark.table(f"{pipeline.lakehouse.database}.orders_current").collect()
    assert sorted((r["_source_db"], r["_source_table"], r["id"], r["note"]) for r in rows) == [
        ("shop_1", "orders", 7, "one"), ("shop_2", "orders", 7, "two again")]


HOSTILE_TABLE = 'shop.we"ird`; DROP TABLE victim; --'
HOSTILE_COLUMNS = ("a`b", "c;d", "e'f", 'g"h', "sp ace", "x`; DROP TABLE victim; --", "dot.ted")


def _hostile_event(values: dict, position: int, types: dict) -> ChangeEvent:
    return ChangeEvent(HOSTILE_TABLE, "c", (values["id"],), ("id",), None, values,
                       Position(1, 1, position, 0), None, column_types=types)


def test_hostile_names_are_replicated_as_data(spark, make_config_each_path: MakeConfig) -> None:
    # Names like these need column mapping, an opt-in (a replica without it refuses
    # them by name: tests/lakehouse/test_delta_readers.py).
    pipeline = make_config_each_path([{"source": re.escape(HOSTILE_TABLE), "replica": "weird"}],
                                   table_features=["column_mapping"])
    db = pipeline.lakehouse.database
    part, builder = setup(spark, pipeline)
    part.writer.ensure_table()
    assert register_changelog(spark, pipeline)  # creates the database the victim lives in
    spark.sql(f"CREATE TABLE {db}.victim (x int) USING delta")
    types = {"id": "bigint", **{c: "string" for c in HOSTILE_COLUMNS}}
    values = {"id": 1, **{c: f"value of {c}" for c in HOSTILE_COLUMNS}}
    part.write(part.records([[_hostile_event(values, 10, types)]]))
    builder.apply("weird")

    (got,) = spark.table(f"{db}.weird_current").collect()
    assert (got["_source_db"], got["_source_table"]) == tuple(HOSTILE_TABLE.split(".", 1))
    assert {c: got[c] for c in HOSTILE_COLUMNS} == {c: values[c] for c in HOSTILE_COLUMNS}
    assert spark.catalog.tableExists(f"{db}.victim")


@pytest.mark.parametrize("column", ["_op", "new\nline", "Dot.Ted"])
def test_unusable_names_are_rejected_before_anything_runs(
        spark, make_config_each_path: MakeConfig, column: str) -> None:
    # Names like these need column mapping, an opt-in (a replica without it refuses
    # them by name: tests/lakehouse/test_delta_readers.py).
    pipeline = make_config_each_path([{"source": re.escape(HOSTILE_TABLE), "replica": "weird"}],
                                   table_features=["column_mapping"])
    part, builder = setup(spark, pipeline)
    types = {"id": "bigint", "dot.ted": "string", column: "string"}
    event = _hostile_event({"id": 1, "dot.ted": "x", column: "y"}, 10, types)
    part.write(part.records([[event]]))
    with pytest.raises(UnsafeIdentifierError, match=re.escape(repr(column)) + "|differ only"):
        builder.apply("weird")
    assert not spark.catalog.tableExists(f"{pipeline.lakehouse.database}.weird")
    assert builder.applied_version("weird") is None


@pytest.mark.parametrize("column", ["_rank", "_RANK_", "_image", "_stored"])
def test_columns_named_like_the_applys_working_columns_are_data(
        spark, make_config_each_path: MakeConfig, column: str) -> None:
    pipeline = make_config_each_path(ORDERS)
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders", types={"id": "bigint", column: "string"})
    part.write(part.records([[src.insert({"id": 1, column: "one"}),
                              src.insert({"id": 2, column: "two"})]]))
    builder.apply("orders")
    part.write(part.records([src.update({"id": 1, column: "one"}, {"id": 1, column: "uno"}),
                             [src.delete({"id": 2, column: "two"})],
                             [src.insert({"id": 3, column: "three"})]]))
    builder.apply("orders")
    assert live(spark, pipeline, columns=("id", column), view=True) == {1: ("uno",),
                                                                        3: ("three",)}


def test_key_columns_named_like_the_applys_working_columns_are_keys(
        spark, make_config_each_path: MakeConfig) -> None:
    # `_image` holds a change's JSON image and `_wm` a truncate's watermark while an
    # apply runs; a source key of those names must stay a key (a truncate brings `_wm`).
    pipeline = make_config_each_path(ORDERS)
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders", types={"_image": "bigint", "_wm": "string", "v": "string"},
                 key_columns=("_image", "_wm"))
    one, two = {"_image": 1, "_wm": "a", "v": "one"}, {"_image": 2, "_wm": "b", "v": "two"}
    part.write(part.records([[src.insert(one)], [src.insert(two)]]))
    builder.apply("orders")
    part.write(part.records([[src.truncate()], [src.insert(one)],
                             [src.insert({"_image": 3, "_wm": "c", "v": "three"})]]))
    builder.apply("orders")
    part.write(part.records([src.update(one, {**one, "v": "uno"}),
                             [src.delete({"_image": 3, "_wm": "c", "v": "three"})]]))
    builder.apply("orders")
    assert live(spark, pipeline, columns=("_image", "_wm", "v")) == {1: ("a", "uno")}
    keys = spark.table(f"{pipeline.lakehouse.database}.orders").select("_image", "_wm")
    # The truncate's marker, the live row and the delete's tombstone.
    assert {tuple(r) for r in keys.collect()} == {(None, None), (1, "a"), (3, "c")}


def test_rebuild_reproduces_the_live_rows(spark, make_config_each_path: MakeConfig) -> None:
    pipeline = make_config_each_path(ORDERS)
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders")
    a = row(1, "1.00", "a")
    part.write(part.records([[src.insert(a)], [src.insert(row(2))]]))
    builder.apply("orders")
    part.write(part.records([src.update(a, row(1, "1.25", "b")), [src.delete(row(2))]]))
    builder.apply("orders")
    expected = live(spark, pipeline)
    result = builder.rebuild("orders")
    assert result.applied_version == changelog_version(spark, pipeline) and result.rows == 4
    assert live(spark, pipeline) == expected == {1: (Decimal("1.25"), "b")}


def test_a_row_change_without_a_key_value_fails_the_apply_naming_it(
        spark, make_config: MakeConfig) -> None:
    pipeline = make_config(ORDERS)
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders")
    keyless = ChangeEvent("shop.orders", "c", (), ("id",), None,
                          {"amount": Decimal("1.00"), "note": "x", "qty": 1},
                          Position(1, 9, 500, 0), None, column_types=src.types)
    part.write(part.records([[src.insert(row(1))], [src.truncate()], [keyless]]))
    with pytest.raises(Exception, match=r"replica orders: a change of shop\.orders at offset 2 "
                                        r"has no value for key column 'id'"):
        builder.apply("orders")


def test_integer_keys_read_off_the_record_key_equal_the_json_parse(spark) -> None:
    """The reduce reads a one-column integer key straight off `{"id":<digits>}`; for any
    other text it must give null (so the JSON parse decides), never a different value."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from binlog_assets.lakehouse.replica.rows import integer_key as _integer_key

    read = {'{"id":123}': 123, '{"id":-5}': -5, '{"id":0}': 0,
            '{"id":9223372036854775807}': 9223372036854775807}
    left_to_the_parse = ['{"id":+5}', '{"id":-0}', '{"id":007}', '{"id":1.0}', '{"id":1e3}',
                         '{"id":"12"}', '{"id":1,"x":2}', '{"id":99999999999999999999}', '{"ID":5}',
                         ' {"id":5}', '{"id":5 }', '{"id": 5}', '{"id":null}', '{"id":}',
                         '{"id":', '{"id":5}}', '{"x":{"id":5}}', '{}', '', None]
    frame = spark.createDataFrame([(t,) for t in [*read, *left_to_the_parse]], "key string")
    parsed = F.from_json("key", "id string").getField("id").try_cast("bigint")
    got = {r["key"]: (r["fast"], r["parsed"]) for r in frame.select(
        "key", _integer_key("id", T.LongType()).alias("fast"), parsed.alias("parsed")).collect()}
    assert {k: got[k][0] for k in read} == read
    assert {k: got[k][0] for k in left_to_the_parse} == dict.fromkeys(left_to_the_parse)
    assert all(fast == parsed for fast, parsed in got.values() if fast is not None)
    # Too wide for the column's type: null here, and the parse's cast decides as before.
    narrow = frame.select(_integer_key("id", T.IntegerType()).alias("v"))
    assert [r["v"] for r in narrow.where(F.col("key") == '{"id":9223372036854775807}')
            .collect()] == [None]
    assert _integer_key("id", T.StringType()) is None
    assert _integer_key("id", T.DecimalType(10, 0)) is None


def test_an_apply_with_nothing_for_a_replica_commits_nothing(
        spark, make_config: MakeConfig) -> None:
    from binlog_assets.lakehouse.delta_log import table_version

    pipeline = make_config([*ORDERS, {"source": "shop.customers", "replica": "customers"}])
    db = pipeline.lakehouse.database
    part, builder = setup(spark, pipeline)
    orders, customers = Source("shop.orders"), Source("shop.customers")
    part.write(part.records([[orders.insert(row(1, "1.00", "a"))],
                             [customers.insert(row(7))]]))
    builder.apply("orders")
    before = table_version(spark, db, "orders")
    # Only customers change: the orders replica is current without a commit of its own.
    part.write(part.records([[customers.insert(row(8))], [customers.insert(row(9))]]))
    quiet = builder.apply("orders")
    assert quiet.applied_version == changelog_version(spark, pipeline)
    assert (quiet.rows, quiet.written) == (0, 0)
    assert table_version(spark, db, "orders") == before
    # The next change of orders applies from where the replica's commits left off.
    part.write(part.records([orders.update(row(1, "1.00", "a"), row(1, "2.00", "b")),
                             [orders.insert(row(2))]]))
    builder.apply("orders")
    assert live(spark, pipeline) == {1: (Decimal("2.00"), "b"), 2: (Decimal("1.00"), "n")}
    assert table_version(spark, db, "orders") == before + 1


def test_a_new_replica_is_created_with_its_rows_in_one_commit(
        spark, make_config: MakeConfig) -> None:
    """Spark's CTAS (a batch above lakehouse.arrow_commit_rows): its first commit holds
    the table, the rows and the applied changelog version."""
    from binlog_assets.lakehouse.delta_log import open_log, table_location
    from binlog_assets.lakehouse.replica.plan import KEY_PROPERTY, TRUNCATED_PROPERTY
    from binlog_assets.lakehouse.transactions import APP_ID

    pipeline = make_config(ORDERS, arrow_commit_rows=0)
    db = pipeline.lakehouse.database
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders")
    part.write(part.records([[src.insert(row(1, "1.00", "a"))], [src.truncate()],
                             [src.insert(row(2, "2.00", "b"))]]))
    result = builder.apply("orders")
    assert (result.written, result.key_rule) == (2, "primary_key")
    log = open_log(table_location(spark, db, "orders"))
    assert log.version() == 0
    assert log.transaction_version(APP_ID) == result.applied_version
    props = log.metadata().configuration
    assert props[KEY_PROPERTY] == '["id"]' and props[TRUNCATED_PROPERTY] == "true"
    assert live(spark, pipeline) == {2: (Decimal("2.00"), "b")}
    assert builder.apply("orders").skipped


def test_a_new_small_replica_is_created_by_spark_and_filled_by_delta_rs(
        spark, make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark's CREATE TABLE (catalog, schema, properties), then one delta-rs commit with
    the rows and the applied changelog version. A crash between the two leaves an empty
    replica that the next apply fills, exactly once."""
    from binlog_assets.lakehouse import delta_log
    from binlog_assets.lakehouse.delta_log import open_log, table_location
    from binlog_assets.lakehouse.replica import arrow_write
    from binlog_assets.lakehouse.replica import merge as merge_module
    from binlog_assets.lakehouse.replica.plan import KEY_PROPERTY, TRUNCATED_PROPERTY
    from binlog_assets.lakehouse.transactions import APP_ID

    pipeline = make_config(ORDERS)
    db = pipeline.lakehouse.database
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders")
    part.write(part.records([[src.insert(row(1, "1.00", "a"))], [src.truncate()],
                             [src.insert(row(2, "2.00", "b"))]]))

    def crash(*args, **kwargs) -> int:
        raise RuntimeError("killed between the create and the rows")

    # The Arrow way or Spark's: either commits the rows by delta-rs after the CREATE.
    monkeypatch.setattr(merge_module, "commit_rows", crash)
    monkeypatch.setattr(arrow_write, "commit_arrow", crash)
    with pytest.raises(RuntimeError, match="killed"):
        builder.apply("orders")
    # Remembered at its creation, where the catalog says it is: its commits ask no one.
    described = {r["col_name"]: r["data_type"]
                 for r in spark.sql(f"DESCRIBE TABLE EXTENDED {db}.orders").collect()}
    assert delta_log._known(spark)[(db, "orders")] == described["Location"]
    log = open_log(table_location(spark, db, "orders"))
    assert (log.version(), log.transaction_version(APP_ID)) == (0, None)
    props = log.metadata().configuration
    assert props[KEY_PROPERTY] == '["id"]' and props[TRUNCATED_PROPERTY] == "true"
    assert spark.table(f"{db}.orders").count() == 0

    monkeypatch.undo()
    result = ReplicaBuilder(spark, pipeline).apply("orders")
    assert (result.written, result.key_rule) == (2, "primary_key")
    log = open_log(table_location(spark, db, "orders"))
    assert log.version() == 1
    assert log.transaction_version(APP_ID) == result.applied_version
    assert [h["operation"] for h in log.history()] == ["WRITE", "CREATE TABLE"]
    assert live(spark, pipeline) == {2: (Decimal("2.00"), "b")}
    assert builder.apply("orders").skipped


@pytest.mark.parametrize("committed", [False, True], ids=["no-commit", "first-commit"])
@pytest.mark.parametrize("arrow_rows", [None, 0])
def test_files_of_a_creation_killed_before_the_catalog_knew_it_do_not_block_the_next(
        spark, make_config: MakeConfig, arrow_rows: int | None, committed: bool) -> None:
    """A SIGKILL inside Spark's CREATE TABLE or CTAS leaves files at the new replica's
    location, and no log or only its first commit (the catalog entry comes last): the
    next apply creates the replica there all the same."""
    from pathlib import Path

    import pyarrow as pa
    from deltalake import write_deltalake

    from binlog_assets.lakehouse.delta_log import delta_rs_uri, ensure_database

    pipeline = make_config(ORDERS, arrow_commit_rows=arrow_rows)
    db = pipeline.lakehouse.database
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders")
    part.write(part.records([[src.insert(row(1, "1.00", "a"))]]))
    ensure_database(spark, db)
    debris = Path(delta_rs_uri(spark.catalog.getDatabase(db).locationUri)) / "orders"
    if committed:
        write_deltalake(str(debris), pa.table({"other": [1]}))
    (debris / "_delta_log" / "_staged_commits").mkdir(parents=True)
    (debris / "_delta_log" / ".00000000000000000001.json.tmp").write_text("{")
    (debris / "part-00000-killed.snappy.parquet").write_bytes(b"PAR1")
    result = builder.apply("orders")
    assert (result.written, result.key_rule) == (1, "primary_key")
    assert live(spark, pipeline) == {1: (Decimal("1.00"), "a")}
    assert not (debris / "part-00000-killed.snappy.parquet").exists()


def test_a_batch_that_changes_no_row_still_moves_the_applied_version(
        spark, make_config_each_path: MakeConfig) -> None:
    """Every change of the batch is older than its row (the guard drops them all): the
    apply writes nothing and still records the changelog version it applied, so the
    next apply has nothing to do."""
    from binlog_assets.lakehouse.delta_log import txn_version
    from binlog_assets.lakehouse.transactions import APP_ID

    pipeline = make_config_each_path(ORDERS)
    db = pipeline.lakehouse.database
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders")
    part.write(part.records([[src.insert(row(1, "1.00", "a"))]]))
    builder.apply("orders")
    late = Source("shop.orders", pos=10)  # an earlier binlog position than the insert's
    part.write(part.records([late.update(row(1, "1.00", "a"), row(1, "9.00", "old"))]))
    result = builder.apply("orders")
    assert (result.rows, result.written) == (1, 0)
    assert txn_version(spark, db, "orders", APP_ID) == result.applied_version
    assert builder.apply("orders").skipped
    assert live(spark, pipeline) == {1: (Decimal("1.00"), "a")}


def test_a_missing_view_of_live_rows_comes_back_with_the_next_apply(
        spark, make_config: MakeConfig) -> None:
    """A crash between the replica's first commit and its view leaves a replica that is
    up to date and has no view: the next apply, with nothing to do, makes it."""
    pipeline = make_config(ORDERS)
    db = pipeline.lakehouse.database
    part, builder = setup(spark, pipeline)
    src = Source("shop.orders")
    part.write(part.records([[src.insert(row(1, "1.00", "a"))]]))
    builder.apply("orders")
    spark.sql(f"DROP VIEW {db}.orders_current")
    # A later run is a process of its own, which knows no view yet.
    known_views(spark).clear()
    again = ReplicaBuilder(spark, pipeline).apply("orders")
    assert again.skipped
    assert live(spark, pipeline, view=True) == {1: (Decimal("1.00"), "a")}


@pytest.mark.parametrize(("arrow_rows", "creates"), [(None, "create_table"),
                                                    (0, "create_with_rows")])
def test_a_replica_created_by_another_builder_meanwhile_is_applied_on_top(
        spark, make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch,
        arrow_rows: int | None, creates: str) -> None:
    """Two builders create the same new replica: the one that finds it created after it
    looked refuses nothing and loses nothing; it applies what the other did not. Its
    rows by delta-rs after Spark's CREATE TABLE, or (lakehouse.arrow_commit_rows 0) in
    Spark's CTAS."""
    from binlog_assets.lakehouse.replica import arrow_write, merge

    # The Arrow way creates the table in arrow_write; Spark's CTAS in its merge.
    replica_module = arrow_write if creates == "create_table" else merge
    pipeline = make_config(ORDERS, arrow_commit_rows=arrow_rows)
    part, first = setup(spark, pipeline)
    other = ReplicaBuilder(spark, pipeline)
    src = Source("shop.orders")
    part.write(part.records([[src.insert(row(1, "1.00", "a"))]]))
    raced = changelog_version(spark, pipeline)
    real = getattr(replica_module, creates)
    calls = []

    def other_builder_first(*args, **kwargs) -> None:
        calls.append(args)
        if len(calls) == 1:
            # Between the first builder's look and its write, the other one builds the
            # replica, and one more change lands in the changelog.
            other.apply("orders", up_to_version=raced)
            part.write(part.records([[src.insert(row(2, "2.00", "b"))]]))
        real(*args, **kwargs)

    monkeypatch.setattr(replica_module, creates, other_builder_first)
    result = first.apply("orders")
    assert len(calls) == 2  # the first builder's (refused), the other one's
    assert result.applied_version == raced + 1 and result.written == 1
    assert live(spark, pipeline) == {1: (Decimal("1.00"), "a"), 2: (Decimal("2.00"), "b")}
