"""`delta_log` without Spark: delta-rs reads of tables written in tmp_path, found through a
stand-in session whose catalog this module's lookups consult, and the SQL and names it
builds for Spark."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import types as T

from binlog_assets.lakehouse.delta_log import (
    create_table,
    delta_rs_uri,
    ensure_database,
    forget,
    is_remote,
    last_commit_metrics,
    merge_aliases,
    metrics_since,
    remember,
    share_lookups,
    stored_rows,
    table_detail,
    table_exists,
    table_location,
    table_version,
    txn_version,
)

APP = "binlake/shop.orders/0"


class FakeRows:
    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows

    def collect(self) -> list[dict]:
        return self.rows


class FakeSpark:
    """A session whose catalog knows the tables in `catalog` (name -> location) and
    records every SQL statement; what delta_log asks of a classic session, no JVM."""

    def __init__(self, catalog: dict[tuple[str, str], str] | None = None) -> None:
        self.tables = dict(catalog or {})
        self.statements: list[str] = []
        self.catalog = self

    def tableExists(self, name: str) -> bool:  # Spark's spelling
        return any(name == f"`{db}`.`{table}`" for db, table in self.tables)

    def getDatabase(self, name: str) -> SimpleNamespace:  # Spark's spelling
        return SimpleNamespace(locationUri=f"file:/nonexistent/warehouse/{name}.db")

    def sql(self, statement: str) -> FakeRows:
        self.statements.append(statement)
        for (db, table), location in self.tables.items():
            if statement == f"DESCRIBE TABLE EXTENDED `{db}`.`{table}`":
                return FakeRows([{"col_name": "id", "data_type": "bigint"},
                                 {"col_name": "# Detailed Table Information",
                                  "data_type": ""},
                                 {"col_name": "Location", "data_type": location},
                                 {"col_name": "Provider", "data_type": "delta"}])
        return FakeRows([])


@pytest.fixture
def orders(tmp_path: Path) -> Path:
    """A Delta table of two commits: 2 rows, then 3 rows with a transaction (APP, 42)."""
    path = tmp_path / "orders"
    write_deltalake(str(path), pa.table({"id": [1, 2]}),
                    configuration={"delta.appendOnly": "true"})
    write_deltalake(str(path), pa.table({"id": [3, 4, 5]}), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(APP, 42)]))
    return path


@pytest.mark.parametrize(("uri", "expected"), [
    ("s3a://bucket/lake/orders", "s3://bucket/lake/orders"),
    ("file:/var/lake/orders", "/var/lake/orders"),
    ("file:///var/lake/orders", "/var/lake/orders"),
    ("/var/lake/orders", "/var/lake/orders"),
    ("s3://bucket/orders", "s3://bucket/orders"),
])
def test_delta_rs_uri(uri: str, expected: str) -> None:
    assert delta_rs_uri(uri) == expected


def test_only_a_spark_connect_session_is_remote() -> None:
    remote = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})()
    classic = type("SparkSession", (), {"__module__": "pyspark.sql.session"})()
    assert is_remote(remote) and not is_remote(classic)


def test_a_location_is_looked_up_once_and_forgotten_on_request(orders: Path) -> None:
    spark = FakeSpark({("shop", "orders"): f"file:{orders}"})
    assert table_location(spark, "shop", "orders") == f"file:{orders}"
    assert table_location(spark, "shop", "orders") == f"file:{orders}"
    assert len(spark.statements) == 1
    forget(spark, "shop", "orders")
    table_location(spark, "shop", "orders")
    assert len(spark.statements) == 2


def test_a_table_without_a_location_is_an_error() -> None:
    with pytest.raises(ValueError, match="shop.ghost has no location in the catalog"):
        table_location(FakeSpark(), "shop", "ghost")


def test_a_remembered_table_exists_without_asking_the_catalog(orders: Path) -> None:
    spark = FakeSpark()
    assert not table_exists(spark, "shop", "orders")
    remember(spark, "shop", "orders", str(orders))
    assert table_exists(spark, "shop", "orders")
    assert table_version(spark, "shop", "orders") == 1
    assert spark.statements == []
    # Each session keeps its own: another one still asks its catalog.
    assert not table_exists(FakeSpark(), "shop", "orders")


def test_sessions_that_share_lookups_ask_the_catalog_once(orders: Path) -> None:
    """Each replica builder runs its own session beside the run's: it finds what the
    run's lookups (and other builders') found, and forgets for all."""
    parent = FakeSpark({("shop", "orders"): f"file:{orders}"})
    table_location(parent, "shop", "orders")
    ensure_database(parent, "lake")
    first, second = FakeSpark(parent.tables), FakeSpark(parent.tables)
    share_lookups(parent, first)
    share_lookups(parent, second)
    assert table_exists(first, "shop", "orders")
    assert table_location(second, "shop", "orders") == f"file:{orders}"
    ensure_database(first, "lake")
    ensure_database(second, "lake")
    ensure_database(second, "other")
    assert first.statements == []
    assert second.statements == ["CREATE DATABASE IF NOT EXISTS `other`"]
    assert parent.statements == [
        "DESCRIBE TABLE EXTENDED `shop`.`orders`", "CREATE DATABASE IF NOT EXISTS `lake`"]
    forget(first, "shop", "orders")  # a rebuild dropped it
    table_location(parent, "shop", "orders")
    assert parent.statements[-1] == "DESCRIBE TABLE EXTENDED `shop`.`orders`"


def test_versions_and_transactions_read_from_the_log(orders: Path) -> None:
    spark = FakeSpark({("shop", "orders"): f"file:{orders}"})
    assert table_version(spark, "shop", "orders") == 1
    assert txn_version(spark, "shop", "orders", APP) == 42
    assert txn_version(spark, "shop", "orders", "binlake/shop.orders/1") is None
    assert table_version(spark, "shop", "missing") == -1
    assert txn_version(spark, "shop", "missing", APP) is None


def test_detail_rows_and_metrics_read_from_the_log(orders: Path) -> None:
    spark = FakeSpark({("shop", "orders"): f"file:{orders}"})
    detail = table_detail(spark, "shop", "orders")
    assert detail["properties"] == {"delta.appendOnly": "true"}
    assert (detail["numFiles"], detail["location"]) == (2, f"file:{orders}")
    assert stored_rows(spark, "shop", "orders") == 5
    metrics = last_commit_metrics(spark, "shop", "orders")
    assert metrics["num_added_rows"] == "3"
    assert all(type(v) is str for v in metrics.values())
    assert metrics_since(spark, "shop", "orders", 0) == metrics
    assert metrics_since(spark, "shop", "orders", 1) == {}  # no commit after version 1


def test_a_table_dropped_behind_the_sessions_back_is_forgotten(orders: Path) -> None:
    spark = FakeSpark()
    remember(spark, "shop", "orders", str(orders))
    shutil.rmtree(orders)
    with pytest.raises(TableNotFoundError):
        table_version(spark, "shop", "orders")
    assert not table_exists(spark, "shop", "orders")  # asks the catalog again


@pytest.mark.parametrize(("table", "aliases"), [
    (("shop", "orders"), ("orders", "s")),
    (("shop", "s"), ("s", "src")),
    (("shop", "S"), ("S", "src")),
])
def test_merge_source_alias_never_equals_the_target(table: tuple[str, str],
                                                    aliases: tuple[str, str]) -> None:
    assert merge_aliases(table) == aliases


def test_create_table_quotes_names_and_property_values() -> None:
    spark = FakeSpark()
    schema = T.StructType([T.StructField("id", T.LongType(), nullable=False),
                           T.StructField("we`ird", T.DecimalType(20, 0)),
                           T.StructField("tags", T.ArrayType(T.StringType()))])
    create_table(spark, ("shop", "orders"), schema,
                 {"delta.appendOnly": "true", "note": "it's a\\path"})
    assert spark.statements == [
        "CREATE DATABASE IF NOT EXISTS `shop`",
        "CREATE TABLE IF NOT EXISTS `shop`.`orders` (`id` bigint NOT NULL, "
        "`we``ird` decimal(20,0), `tags` array<string>) USING DELTA "
        "TBLPROPERTIES ('delta.appendOnly' = 'true', 'note' = 'it\\'s a\\\\path')",
    ]
    create_table(spark, ("shop", "plain"), schema, {})
    assert spark.statements[-1].endswith("USING DELTA")


class CreatingSpark(FakeSpark):
    """A FakeSpark whose CREATE TABLE makes the table's first commit where Spark would:
    its database's default path, the table's name in lower case."""

    def __init__(self, warehouse: Path) -> None:
        super().__init__()
        self.warehouse = warehouse
        self.databases_asked = 0

    def getDatabase(self, name: str) -> SimpleNamespace:  # Spark's spelling
        self.databases_asked += 1
        return SimpleNamespace(locationUri=f"file:{self.warehouse}/{name}.db")

    def sql(self, statement: str) -> FakeRows:
        if statement.startswith("CREATE TABLE `shop`.`Orders`"):
            write_deltalake(str(self.warehouse / "shop.db" / "orders"),
                            pa.table({"id": pa.array([], pa.int64())}))
        return super().sql(statement)


def test_a_table_just_created_is_found_at_its_default_path(tmp_path: Path) -> None:
    spark = CreatingSpark(tmp_path)
    schema = T.StructType([T.StructField("id", T.LongType())])
    create_table(spark, ("shop", "Orders"), schema, {}, exists_ok=False)
    # Its first commit asks the catalog nothing more.
    assert table_location(spark, "shop", "Orders") == f"file:{tmp_path}/shop.db/orders"
    assert not any(s.startswith("DESCRIBE") for s in spark.statements)
    # Where the path holds no table (another location), the catalog is asked.
    create_table(spark, ("shop", "elsewhere"), schema, {}, exists_ok=False)
    with pytest.raises(ValueError, match="no location"):
        table_location(spark, "shop", "elsewhere")
    assert spark.databases_asked == 1


_POSITION = pa.struct([(n, pa.int64()) for n in ("phase", "file", "pos", "row", "offset",
                                                  "row_index")])


def _replica_rows(ids: list[int | None], ops: list[str]) -> pa.Table:
    return pa.table({
        "_source_db": ["shop"] * len(ids), "_source_table": ["t"] * len(ids),
        "id": pa.array(ids, pa.int64()),
        "_position": pa.array([{"phase": 1, "file": 9, "pos": 100 + i, "row": 0,
                                "offset": i, "row_index": 0} for i in range(len(ids))],
                              _POSITION),
        "_op": ops})


def test_truncate_markers_are_read_only_from_files_whose_statistics_allow_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deltalake import DeltaTable

    from binlog_assets.lakehouse.delta_log import file_truncates

    uri = str(tmp_path / "replica")
    write_deltalake(uri, _replica_rows([None, 1], ["t", "c"]))
    assert file_truncates(DeltaTable(uri), "id") == [("shop", "t", (1, 9, 100, 0, 0, 0))]
    # Files of changes only: their key has no null, so no dataset of the files is opened.
    for i in range(3):
        write_deltalake(uri, _replica_rows([i + 2, i + 5], ["u", "c"]), mode="append")
    log = DeltaTable(uri)

    def no_dataset(*args: object, **kwargs: object) -> None:
        raise AssertionError("a file of changes only was read")

    monkeypatch.setattr(log, "to_pyarrow_dataset", no_dataset)
    assert file_truncates(log, "id") == [("shop", "t", (1, 9, 100, 0, 0, 0))]
    # Without a key column, the `_op` range says it: updates only hold no marker.
    write_deltalake(uri, _replica_rows([7], ["u"]), mode="append")
    log = DeltaTable(uri)
    monkeypatch.setattr(log, "to_pyarrow_dataset", no_dataset)
    assert len(file_truncates(log, None)) == 1
    # A file that may hold one is read.
    monkeypatch.undo()
    write_deltalake(uri, _replica_rows([8, None], ["c", "t"]), mode="append")
    assert sorted(file_truncates(DeltaTable(uri), "id")) == [
        ("shop", "t", (1, 9, 100, 0, 0, 0)), ("shop", "t", (1, 9, 101, 0, 1, 0))]
