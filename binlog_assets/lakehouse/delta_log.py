"""Delta transaction state and a changelog range's rows, for in-process and remote Spark.

Delta records, with every commit that sets `txnAppId`/`txnVersion` (DataFrameWriter
options) or `spark.databricks.delta.write.txnAppId`/`txnVersion` (session settings, for
MERGE), the highest version per application id in the same atomic commit as the data.
binlake uses that state twice: the changelog's per-partition checkpoint (application id
`group/topic/partition`, version = end offset) and each replica's applied changelog
version. Neither Spark SQL nor the Python `DeltaTable` exposes it, so delta-rs reads it
from the table's log: the same answer for a Spark session in this process and one
reached through Spark Connect, with no JVM call.

`added_rows` reads what a range of commits added. In a classic session it goes through
the JVM to Delta's `CDCReader.changesToBatchDF`, the change feed's own planner, because
the public reader (`readChangeFeed`) wraps that plan in a `BaseRelation` whose scan goes
through `.rdd` (half the time for 1M rows: bench/RESULTS.md, "Replica apply against a
plain Delta write"). Over Spark Connect there is no JVM at hand, and the public reader it is.
"""

from __future__ import annotations

import shutil
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from binlog_assets.formats.event import OP_TRUNCATE
from binlog_assets.identifiers import col, qualified, quote

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import types as T

# Table properties of the opt-in features that keep a table's writes in Spark: delta-rs
# does not write deletion vectors, column mapping or type widening.
SPARK_ONLY_PROPERTIES = frozenset({"delta.enableDeletionVectors", "delta.columnMapping.mode",
                                   "delta.enableTypeWidening"})

# The change feed's own columns, which `added_rows` drops.
CHANGE_FEED_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")

# Where each table's files are, per catalog (the sessions `share_lookups` joins): a
# catalog lookup is a round trip (0.17 s over Spark Connect, 30-50 ms to the embedded
# Hive metastore) that a one-row apply made a dozen times. Only tables found are
# remembered; `forget` one that is dropped. Databases made or found are remembered too.
_locations: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_databases: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_views: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_database_uris: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def delta_rs_uri(uri: str) -> str:
    """`uri` as delta-rs spells it: Hadoop's `s3a://` scheme is plain `s3://` there, and
    Spark's `file:/path` locations are plain paths."""
    if uri.startswith("s3a://"):
        return "s3://" + uri[len("s3a://"):]
    if uri.startswith("file:"):
        return "/" + uri[len("file:"):].lstrip("/")
    return uri


def is_remote(spark: SparkSession) -> bool:
    """Whether `spark` is a Spark Connect session (no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _known(spark: SparkSession) -> dict[tuple[str, str], str]:
    return _locations.setdefault(spark, {})


def share_lookups(parent: SparkSession, child: SparkSession) -> None:
    """Let `child`, a session beside `parent` on the same catalog, use (and add to) what
    `parent`'s lookups found: each replica builder's own session started with none."""
    _locations[child] = _known(parent)
    _databases[child] = _databases.setdefault(parent, set())
    _views[child] = known_views(parent)
    _database_uris[child] = _database_uris.setdefault(parent, {})


def known_views(spark: SparkSession) -> set[tuple[str, str]]:
    """Views `spark`'s catalog is known to have (made or found by this process)."""
    return _views.setdefault(spark, set())


def ensure_database(spark: SparkSession, database: str) -> None:
    """`CREATE DATABASE IF NOT EXISTS`, once per catalog and process."""
    made = _databases.setdefault(spark, set())
    if database not in made:
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {qualified(database)}")
        made.add(database)


def database_location(spark: SparkSession, database: str) -> str:
    """The database's location URI, looked up once per catalog and process."""
    uris = _database_uris.setdefault(spark, {})
    if database not in uris:
        uris[database] = spark.catalog.getDatabase(database).locationUri
    return uris[database]


def table_exists(spark: SparkSession, database: str, table: str) -> bool:
    return ((database, table) in _known(spark)
            or spark.catalog.tableExists(qualified(database, table)))


def table_location(spark: SparkSession, database: str, table: str) -> str:
    """Where the catalog says the table's files are (a catalog lookup, no Spark job)."""
    known = _known(spark)
    if (database, table) not in known:
        # Filtered in Python: a command's own rows come back without a Spark job, a
        # filter on them runs one (half the lookup's time).
        rows = spark.sql(f"DESCRIBE TABLE EXTENDED {qualified(database, table)}").collect()
        location = next((r["data_type"] for r in rows if r["col_name"] == "Location"), None)
        if location is None:
            raise ValueError(f"{database}.{table} has no location in the catalog")
        known[(database, table)] = location
    return known[(database, table)]


def remember(spark: SparkSession, database: str, table: str, location: str) -> None:
    """Note where a table registered by this session keeps its files."""
    _known(spark)[(database, table)] = location


def forget(spark: SparkSession, database: str, table: str) -> None:
    """Drop what `spark`'s lookups remember of a table (after it was dropped)."""
    _known(spark).pop((database, table), None)


def _log(spark: SparkSession, database: str, table: str) -> DeltaTable:
    from deltalake.exceptions import TableNotFoundError

    try:
        return open_log(table_location(spark, database, table))
    except TableNotFoundError:
        forget(spark, database, table)  # dropped behind this session's back
        raise


def open_log(location: str) -> DeltaTable:
    """The table's log at its newest version. Within a `log_scope` each location is
    opened once per thread and brought up to date at each later use: an open reads the
    log from its last checkpoint, an update only the commits since."""
    from deltalake import DeltaTable

    uri = delta_rs_uri(location)
    logs = getattr(_scope, "logs", None)
    if logs is None:
        return DeltaTable(uri)
    log = logs.get(uri)
    if log is None:
        log = logs[uri] = DeltaTable(uri)
    else:
        log.update_incremental()
    return log


_scope = threading.local()


@contextmanager
def log_scope() -> Iterator[None]:
    """Logs opened in this thread meanwhile are kept until it ends: one apply's many
    reads of a table's log. Not across applies: a table dropped and made again at the
    same location starts its versions anew, which an update would not notice."""
    outer = getattr(_scope, "logs", None)
    if outer is None:
        _scope.logs = {}
    try:
        yield
    finally:
        if outer is None:
            _scope.logs = None


def table_version(spark: SparkSession, database: str, table: str) -> int:
    """The table's current Delta version, -1 when the table does not exist."""
    if not table_exists(spark, database, table):
        return -1
    return int(_log(spark, database, table).version())


def txn_version(spark: SparkSession, database: str, table: str, app_id: str) -> int | None:
    """The last `txnVersion` committed for `app_id`, None when there is none (or no table)."""
    if not table_exists(spark, database, table):
        return None
    found = _log(spark, database, table).transaction_version(app_id)
    return None if found is None else int(found)


def added_rows(spark: SparkSession, database: str, table: str, first: int, last: int
               ) -> DataFrame:
    """The rows that commits `first`..`last` (inclusive) added to append-only Delta table
    `database.table` (change data feed enabled), in the table's schema.

    In a classic session: the same rows as `readChangeFeed` over those versions, planned
    by the same Delta code, but scanned as Parquet files (columnar, whole-stage code
    generation) instead of through the feed relation's row conversion. Delta's checks of
    the range (commits no longer in the log, a table without the feed) apply either way.
    """
    if is_remote(spark):
        return (spark.read.format("delta").option("readChangeFeed", "true")
                .option("startingVersion", first).option("endingVersion", last)
                .table(qualified(database, table)).drop(*CHANGE_FEED_COLUMNS))
    from pyspark.sql import DataFrame

    jvm = spark._jvm
    ident = jvm.org.apache.spark.sql.catalyst.TableIdentifier(table, jvm.scala.Some(database))
    none = jvm.scala.Option.empty()
    # update(stalenessAcceptable=false, ...): always the newest commit, never a cached one.
    snapshot = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
        spark._jsparkSession, ident).update(False, none, none)
    jdf = jvm.org.apache.spark.sql.delta.commands.cdc.CDCReader.changesToBatchDF(
        snapshot.deltaLog(), first, last, spark._jsparkSession, none,
        jvm.scala.Some(snapshot), False, none)
    return DataFrame(jdf, spark).drop(*CHANGE_FEED_COLUMNS)


def table_detail(spark: SparkSession, database: str, table: str) -> dict:
    """The table's properties, number of data files and location, as `DESCRIBE DETAIL`
    names them; read from the log by delta-rs (10 ms, where the Spark job took 2 s)."""
    log = _log(spark, database, table)
    return {"properties": dict(log.metadata().configuration),
            "numFiles": len(log.file_uris()),
            "location": table_location(spark, database, table)}


def found_detail(spark: SparkSession, database: str, table: str) -> dict | None:
    """`table_detail` of the table; None where the catalog has no such table."""
    if not table_exists(spark, database, table):
        return None
    return table_detail(spark, database, table)


def table_schema(spark: SparkSession, database: str, table: str) -> T.StructType:
    """The table's schema as Spark types, from its log by delta-rs: a Spark lookup of a
    table whose last commit delta-rs wrote reconstructs its metadata in a job first. The
    Delta log stores the schema in Spark's own JSON form."""
    import json

    from pyspark.sql import types as T

    return T.StructType.fromJson(json.loads(_log(spark, database, table).schema().to_json()))


def stored_rows(spark: SparkSession, database: str, table: str) -> int | None:
    """Rows in the table's data files by the log's file statistics (rows that deletion
    vectors hide still count); None when a file has no statistics."""
    return file_rows(_log(spark, database, table))


def file_rows(log: DeltaTable) -> int | None:
    """Rows in the data files of `log`'s current version, by their statistics."""
    # Read as delta-rs returns it (arro3): converting to pyarrow first cost a consumer
    # run 0.35 s, most of it pyarrow's import.
    counts = log.get_add_actions(flatten=True).column("num_records").to_pylist()
    return None if None in counts else sum(counts)


def metrics_since(spark: SparkSession, database: str, table: str, before: int
                  ) -> dict[str, str]:
    """The operation metrics of the commit after version `before`; empty when there is
    none (another apply recorded this changelog version first: Delta skipped ours)."""
    if table_version(spark, database, table) == before:
        return {}
    return last_commit_metrics(spark, database, table)


def last_commit_metrics(spark: SparkSession, database: str, table: str) -> dict[str, str]:
    """The operation metrics of the table's latest commit (from the log, as above)."""
    last = _log(spark, database, table).history(1)
    return {k: str(v) for k, v in (last[0].get("operationMetrics") or {}).items()}


def merge_aliases(table: tuple[str, str]) -> tuple[str, str]:
    """The names a MERGE's conditions use for its target and its source.

    `DataFrame.mergeInto` (the MERGE both classic and Connect sessions run; Delta plans
    it as its own) names the target by its table name and takes no alias for it, so the
    source takes a name that differs from the target's.
    """
    target = table[1]
    return target, ("s" if target.lower() != "s" else "src")


def create_table(spark: SparkSession, table: tuple[str, str], schema: T.StructType,
                 properties: dict[str, str], *, exists_ok: bool = True) -> None:
    """`CREATE TABLE [IF NOT EXISTS] ... USING DELTA` with `schema` and `properties`;
    without `exists_ok`, a table already there raises `TableCreatedMeanwhile`."""
    from pyspark.errors import AnalysisException

    columns = ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}"
                        + ("" if f.nullable else " NOT NULL") for f in schema)
    props = _properties_sql(properties)
    ensure_database(spark, table[0])
    try:
        with _creating(spark, table):
            spark.sql(f"CREATE TABLE {'IF NOT EXISTS ' if exists_ok else ''}"
                      f"{qualified(*table)} ({columns}) USING DELTA"
                      + (f" TBLPROPERTIES ({props})" if props else ""))
    except AnalysisException as e:
        if e.getCondition() == "TABLE_OR_VIEW_ALREADY_EXISTS":
            raise TableCreatedMeanwhile(f"{'.'.join(table)} was created meanwhile") from e
        raise
    if not exists_ok:
        _remember_created(spark, table)


def _remember_created(spark: SparkSession, table: tuple[str, str]) -> None:
    """A table this session just created without a LOCATION is at its database's
    default path: remembered there, its first commit then asks the catalog nothing (a
    DESCRIBE, 0.1-0.2 s). Unremembered where delta-rs finds no table there."""
    from deltalake import DeltaTable

    location = f"{database_location(spark, table[0]).rstrip('/')}/{table[1].lower()}"
    if DeltaTable.is_deltatable(delta_rs_uri(location)):
        remember(spark, *table, location)


# One creation of a table at a time in this process (the builders of the follower share
# a JVM and its catalog), so that clearing a killed creation's files races no live one.
_creations: dict[tuple[str, str], threading.Lock] = {}
_creations_lock = threading.Lock()


@contextmanager
def _creating(spark: SparkSession, table: tuple[str, str]) -> Iterator[None]:
    """Hold the table's creation lock; first clear what a creation killed before the
    catalog knew the table left at its local location, which Delta would refuse to
    create a table on (DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION)."""
    with _creations_lock:
        lock = _creations.setdefault((table[0].lower(), table[1].lower()), threading.Lock())
    with lock:
        if not table_exists(spark, *table):
            _clear_unborn(spark, table)
        yield


def _clear_unborn(spark: SparkSession, table: tuple[str, str]) -> None:
    uri = database_location(spark, table[0])
    if not uri.startswith("file:"):
        # On object storage the debris stays, and Delta's error names its location.
        return
    path = Path(delta_rs_uri(uri)) / table[1].lower()
    # Killed before the catalog knew it, a creation leaves no commit or only its first
    # (the catalog entry is its last step): nothing any reader saw. A table with later
    # commits was registered once; that one stays, for Delta's error to name.
    commits = {c.name for c in (path / "_delta_log").glob("*.json")}
    if path.is_dir() and commits <= {f"{0:020d}.json"}:
        shutil.rmtree(path)


class TableCreatedMeanwhile(RuntimeError):
    """`create_with_rows` found the table already there: another writer created it after
    the caller looked. Nothing was written; start over from the table as it now is."""


@dataclass(frozen=True)
class NewTable:
    """A Delta table to create together with its first rows (`create_with_rows`)."""

    name: tuple[str, str]
    schema: T.StructType
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def columns(self) -> list[str]:
        return [f.name for f in self.schema]


def create_with_rows(spark: SparkSession, new: NewTable, rows: DataFrame, app_id: str,
                     version: int) -> None:
    """Create `new` holding `rows` (cast to its schema, in its column order), its
    properties and the transaction (`app_id`, `version`), all in the table's first commit.

    Rather than CREATE TABLE and then an append: Delta answers an append's transaction
    id from the table's state, which it computes in a Spark job of its own, and a table
    being created has no state to compute (bench/RESULTS.md, "Where a Spark apply's time went").
    """
    from pyspark.errors import AnalysisException

    ensure_database(spark, new.name[0])
    # Every column cast by its type's SQL name: over Spark Connect a type sent as an
    # object (a cast's, or `from_json`'s schema upstream) reaches the server as `string
    # collate UTF8_BINARY`, which the new table's schema would keep and delta-rs refuses.
    writer = (rows.select(*[col(f.name).cast(f.dataType.simpleString()).alias(f.name)
                            for f in new.schema])
              .writeTo(qualified(*new.name)).using("delta")
              .option("txnAppId", app_id).option("txnVersion", str(version)))
    for key, value in new.properties.items():
        writer = writer.tableProperty(key, value)
    try:
        with _creating(spark, new.name):
            writer.create()
    except AnalysisException as e:
        if e.getCondition() == "TABLE_OR_VIEW_ALREADY_EXISTS":
            raise TableCreatedMeanwhile(f"{'.'.join(new.name)} was created meanwhile") from e
        raise


def set_properties(spark: SparkSession, table: tuple[str, str], properties: dict[str, str]
                   ) -> None:
    """Set the table's properties in one commit, any text as the values: by delta-rs
    where it writes the table (`rs_writable`), else `ALTER TABLE ... SET TBLPROPERTIES`."""
    if not any(k.startswith("delta.") for k in properties):
        log = _log(spark, *table)
        if rs_writable(log):
            # A metadata-only commit: milliseconds, where Spark's ALTER is 0.1-1 s of
            # driver work. Readers take the properties from the log, as Spark does.
            log.alter.set_table_properties(properties, raise_if_not_exists=False)
            return
    spark.sql(f"ALTER TABLE {qualified(*table)} SET TBLPROPERTIES "
              f"({_properties_sql(properties)})")


def add_columns(spark: SparkSession, table: tuple[str, str], fields: list[T.StructField]
                ) -> None:
    """Add nullable columns at the end of the table's schema, in one commit: by delta-rs
    where it writes the table, else `ALTER TABLE ... ADD COLUMNS`."""
    import json

    log = _log(spark, *table)
    if rs_writable(log):
        from deltalake import Field

        # Delta's schema is Spark's own JSON: each field converts as it is.
        log.alter.add_columns([Field.from_json(json.dumps(f.jsonValue())) for f in fields])
        return
    columns = ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}" for f in fields)
    spark.sql(f"ALTER TABLE {qualified(*table)} ADD COLUMNS ({columns})")


def stored_truncates(spark: SparkSession, table: tuple[str, str], key_column: str | None = None
                     ) -> list[tuple[str, str, tuple[int, ...]]]:
    """(source db, source table, position) of each truncate marker row of a replica
    (`_op` 't'): by delta-rs where it reads the table as Spark would, else a Spark job.
    `key_column`: a source key column, null only in a marker row."""
    log = _log(spark, *table)
    if rs_writable(log):
        return file_truncates(log, key_column)
    rows = (spark.table(qualified(*table)).where(col("_op") == OP_TRUNCATE)
            .select("_source_db", "_source_table", "_position").collect())
    return [(r["_source_db"], r["_source_table"], tuple(r["_position"])) for r in rows]


# A replica's marker rows per data file, by table: a data file never changes, so each is
# read once per process, and an apply reads only the files added since the last one.
_file_marks: dict[tuple[str, str], dict[str, list]] = {}
_file_marks_lock = threading.Lock()


def file_truncates(log: DeltaTable, key_column: str | None = None
                   ) -> list[tuple[str, str, tuple[int, ...]]]:
    """`stored_truncates` of a table delta-rs reads: the marker rows of its current
    files (no deletion vectors). A file is read the first time it is seen, and only
    where its statistics allow a marker: a null `key_column`, an `_op` range holding
    't': the files are listed by the log's add actions, without opening a dataset of
    them all."""
    import pyarrow as pa
    import pyarrow.compute as pc

    actions = pa.table(log.get_add_actions(flatten=True))
    ident = (log.table_uri, log.metadata().id)
    with _file_marks_lock:
        known = _file_marks.get(ident, {})
    current: dict[str, list] = {}
    unread = []
    for path, nulls, low, high in zip(*(_stat(actions, name) for name in (
            "path", f"null_count.{key_column}", "min._op", "max._op")), strict=True):
        marks = known.get(path)
        if marks is None and (nulls == 0 or (low is not None and high is not None
                                             and not low <= OP_TRUNCATE <= high)):
            marks = []
        if marks is None:
            unread.append(path)
        else:
            current[path] = marks
    if unread:
        data = log.to_pyarrow_dataset()
        fragments = {f.path: f for f in data.get_fragments()}
        for path in unread:
            rows = fragments[path].to_table(columns=["_op", "_source_db", "_source_table",
                                                     "_position"], schema=data.schema)
            found = rows.filter(pc.equal(rows["_op"].cast(pa.string()), OP_TRUNCATE))
            current[path] = [(r["_source_db"], r["_source_table"],
                              tuple(r["_position"].values()))
                             for r in found.select(["_source_db", "_source_table",
                                                    "_position"]).to_pylist()]
    with _file_marks_lock:
        _file_marks[ident] = current
    return [mark for marks in current.values() for mark in marks]


def _stat(actions: pa.Table, name: str) -> list:
    """An add-actions column as a list; Nones where the log has no such statistic."""
    if name in actions.schema.names:
        return actions.column(name).to_pylist()
    return [None] * actions.num_rows


def rs_writable(log: DeltaTable) -> bool:
    """Whether delta-rs commits to the table: none of the opt-in features that keep its
    writes in Spark is on."""
    return not SPARK_ONLY_PROPERTIES.intersection(log.metadata().configuration)


def _properties_sql(properties: dict[str, str]) -> str:
    return ", ".join(f"{sql_string(k)} = {sql_string(v)}" for k, v in properties.items())


def sql_string(text: str) -> str:
    """`text` as a Spark SQL string literal (backslash escapes, as Spark parses them)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
