"""Delta transaction state, read from the table's log through the JVM's `DeltaLog`.

Delta records, with every commit that sets `txnAppId`/`txnVersion` (DataFrameWriter
options) or `spark.databricks.delta.write.txnAppId`/`txnVersion` (session settings, for
MERGE), the highest version per application id in the same atomic commit as the data.
binlake uses that state twice: the changelog's per-partition checkpoint (application id
`group/topic/partition`, version = end offset) and each replica's applied changelog
version. The delta-spark Python package exposes no reader for it, so this module asks
the JVM's `DeltaLog` for the latest snapshot (`update()` lists only the new commits)
rather than parsing checkpoint files by hand.

`added_rows` reads what a range of commits added through the same JVM door (Delta's
`CDCReader.changesToBatchDF`, the change feed's own planner), because the public reader
(`readChangeFeed`) wraps that plan in a `BaseRelation` whose scan goes through `.rdd`:
every row converted to an external `Row` and back, strings copied twice (bench/RESULTS.md,
session 8).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from binlog_assets.lakehouse.identifiers import qualified

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The change feed's own columns, which `added_rows` drops.
CHANGE_FEED_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


def table_exists(spark: SparkSession, database: str, table: str) -> bool:
    return spark.catalog.tableExists(qualified(database, table))


def _snapshot(spark: SparkSession, database: str, table: str):
    jvm = spark._jvm
    ident = jvm.org.apache.spark.sql.catalyst.TableIdentifier(table, jvm.scala.Some(database))
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, ident)
    none = jvm.scala.Option.empty()
    # update(stalenessAcceptable=false, ...): always the newest commit, never a cached one.
    return log.update(False, none, none)


def table_version(spark: SparkSession, database: str, table: str) -> int:
    """The table's current Delta version, -1 when the table does not exist."""
    if not table_exists(spark, database, table):
        return -1
    return int(_snapshot(spark, database, table).version())


def txn_version(spark: SparkSession, database: str, table: str, app_id: str) -> int | None:
    """The last `txnVersion` committed for `app_id`, None when there is none (or no table)."""
    if not table_exists(spark, database, table):
        return None
    found = _snapshot(spark, database, table).transactions().get(app_id)
    return int(found.get()) if found.isDefined() else None


def added_rows(spark: SparkSession, database: str, table: str, first: int, last: int
               ) -> DataFrame:
    """The rows that commits `first`..`last` (inclusive) added to append-only Delta table
    `database.table` (change data feed enabled), in the table's schema.

    The same rows as `spark.read.format("delta").option("readChangeFeed", "true")` with
    those versions, planned by the same Delta code, but scanned as Parquet files (columnar,
    whole-stage code generation) instead of through the feed relation's row conversion;
    for 1M changelog rows the scan takes half the time. The public reader's scan calls this
    same function, so Delta's checks of the range (commits no longer in the log, a table
    without the feed) apply as they did.
    """
    from pyspark.sql import DataFrame

    jvm = spark._jvm
    snapshot = _snapshot(spark, database, table)  # the batch's schema, as the feed uses it
    none = jvm.scala.Option.empty()
    jdf = jvm.org.apache.spark.sql.delta.commands.cdc.CDCReader.changesToBatchDF(
        snapshot.deltaLog(), first, last, spark._jsparkSession, none,
        jvm.scala.Some(snapshot), False, none)
    return DataFrame(jdf, spark).drop(*CHANGE_FEED_COLUMNS)
