"""Delta transaction state, read from the table's log through the JVM's `DeltaLog`.

Delta records, with every commit that sets `txnAppId`/`txnVersion` (DataFrameWriter
options) or `spark.databricks.delta.write.txnAppId`/`txnVersion` (session settings, for
MERGE), the highest version per application id in the same atomic commit as the data.
binlake uses that state twice: the changelog's per-partition checkpoint (application id
`group/topic/partition`, version = end offset) and each replica's applied changelog
version. The delta-spark Python package exposes no reader for it, so this module asks
the JVM's `DeltaLog` for the latest snapshot (`update()` lists only the new commits)
rather than parsing checkpoint files by hand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from binlog_assets.lakehouse.identifiers import qualified

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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
