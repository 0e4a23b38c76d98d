"""A replica apply's rewrite path: a catch-up batch overwrites the replica in one commit.

A batch with at least `lakehouse.rewrite_ratio` changes per stored row touches every
file anyway, so MERGE's reduce, materialized source, two joins and deletion vectors buy
nothing: the stored rows and the batch go through one ranking per key and one
overwrite instead. `rewrites` tells which path a batch takes; the MERGE is `merge.py`'s.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql import types as T

from binlog_assets.identifiers import col
from binlog_assets.lakehouse.columns import first_per_group, free_name
from binlog_assets.lakehouse.delta_log import stored_rows, table_version
from binlog_assets.lakehouse.replica.plan import Survey
from binlog_assets.lakehouse.replica.rows import IMAGE, below_truncates, typed_columns
from binlog_assets.lakehouse.transactions import APP_ID

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from binlog_assets.lakehouse.replica.plan import ReplicaTable, RowShape


def rewrites(spark: SparkSession, table: tuple[str, str], survey: Survey, ratio: float
             ) -> bool:
    """Whether the batch is large enough against the replica to rewrite it rather
    than MERGE (`lakehouse.rewrite_ratio`). The replica's size comes from its log's
    file statistics (a Spark count would be a job of its own); rows hidden by deletion
    vectors count too, which only leans towards MERGE."""
    if ratio == 0:
        return True
    stored = stored_rows(spark, *table)
    if stored is None:
        stored = spark.table(".".join(table)).count()
    return survey.rows >= ratio * stored


def rewrite_replica(spark: SparkSession, rows: DataFrame, *, table: ReplicaTable,
                    shape: RowShape, version: int, now: datetime) -> tuple[int, int]:
    """The replica's rows and the batch's changes in one ranking per key, written
    back over the table in one commit; (rows written, rows truncated).

    The same outcome as the MERGE. Each key keeps its highest `_position`, and on a tie
    the row already stored (so a re-applied range leaves every byte, `_applied_at`
    included, as it was: the guard's `>`); rows of a truncated table below its truncate
    are left out. Only the changes that win are parsed from their JSON image. The
    overwrite carries the same transaction id (changelog `version`) as a MERGE would.
    """
    stored = spark.table(".".join(table.name))
    names = stored.columns
    types = {f.name: f.dataType for f in stored.schema}
    # The working column takes a name no replica column has (a source column may be
    # called `_stored` too).
    image, from_table = IMAGE, free_name("_stored", names)
    changes = rows.withColumn("_applied_at", F.lit(now))
    both = (stored.select(*[col(c) for c in names],
                          F.lit(None).cast(T.StringType()).alias(image),
                          F.lit(1).alias(from_table))
            .unionByName(changes.select(
                *[col(c) if c in changes.columns
                  else F.lit(None).cast(types[c]).alias(c) for c in names],
                col(image), F.lit(0).alias(from_table))))
    winners = first_per_group(both, [col(k) for k in shape.key],
                              [col("_position").desc(), col(from_table).desc()])
    winners = typed_columns(winners, [*names, from_table], shape=shape,
                            stored=col(from_table) == 1, image=image, live=True)
    cleared = below_truncates(shape.survey.truncates)
    from pyspark.sql import Observation

    counts = Observation("binlake_rewrite")
    winners = winners.observe(
        counts,
        F.sum(F.when(~cleared & (col(from_table) == 0), 1).otherwise(0)).alias("written"),
        F.sum(F.when(cleared, 1).otherwise(0)).alias("truncated"))
    before = table_version(spark, *table.name)
    (winners.where(~cleared).select(*[col(c) for c in names])
     .write.format("delta").mode("overwrite")
     .option("txnAppId", APP_ID).option("txnVersion", version).save(table.location))
    if table_version(spark, *table.name) == before:
        return 0, 0  # this changelog version was recorded first: Delta skipped ours
    got = counts.get
    return int(got.get("written") or 0), int(got.get("truncated") or 0)
