"""Append-only replicas: the log of a table's changes, one row per change, no key.

The rule for a table without a primary key (and without `key_columns`), or for any table
configured with `replica_mode: append`: without a key there is no row to MERGE a change
into, so every row change and truncate is a row of its own, with the replica's usual
columns (`_source_db`, `_source_table`, the source columns as the change left the row,
the before-image for a delete and nulls for a truncate, then `_position`, `_op`,
`_source_ts`, `_applied_at`). Order the rows by `_position` to replay them.

Each change lands exactly once. The write carries the changelog version as its Delta
transaction id (`ReplicaBuilder`'s `binlake.replica`), so a retried apply adds nothing;
and a change is known by its binlog coordinates (`columns.change_identity`), so a copy
delivered again at another Kafka offset, or recorded in the changelog by a second
consumer group, is dropped within the batch and against the rows already stored.
This module is Spark's way, for a batch past `lakehouse.arrow_commit_rows` or into a
table with a feature delta-rs does not write; a smaller one is appended by delta-rs from
the driver (`replica/arrow_apply.py`, `replica/arrow_commit.py`), to the same rows.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from binlog_assets.identifiers import col, qualified
from binlog_assets.lakehouse.columns import change_identity, first_per_group, free_name
from binlog_assets.lakehouse.delta_log import (
    create_with_rows,
    last_commit_metrics,
    merge_aliases,
    metrics_since,
    table_version,
)
from binlog_assets.lakehouse.transactions import APP_ID, SparkTxn

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from binlog_assets.lakehouse.replica.plan import ReplicaTable


def append_changes(spark: SparkSession, rows: DataFrame,
                   typed: Callable[[DataFrame], DataFrame], *, table: ReplicaTable,
                   version: int, now: datetime) -> int:
    """Append the batch's changes `rows` (`_source_db`, `_source_table`, `_position`,
    `_op`, `_source_ts` and the image, as `rows.keyed_changes` frames them) to the
    append-only replica `table` (created with them when `table.new` says how); `typed`
    turns them into the table's columns. Every commit records changelog `version`.
    Returns the rows written."""
    change = free_name("_change", rows.columns)
    source = [F.col("_source_db"), F.col("_source_table")]
    # One row per change of the batch: the first delivery, by Kafka offset.
    once = first_per_group(rows.withColumn(change, change_identity(F.col("_position"))),
                           [*source, col(change)], [F.col("_position").asc()]).drop(change)
    once = typed(once.withColumn("_applied_at", F.lit(now)))
    name = table.name
    if table.new is not None:
        create_with_rows(spark, table.new, once, APP_ID, version)
        return int(last_commit_metrics(spark, *name).get("numOutputRows", 0))
    before = table_version(spark, *name)
    if table.empty:
        (once.write.format("delta").mode("append")
         .option("txnAppId", APP_ID).option("txnVersion", version)
         .saveAsTable(".".join(name)))
        return int(metrics_since(spark, *name, before).get("numOutputRows", 0))
    t, s = merge_aliases(name)
    same = ((col("_source_db", t) == col("_source_db", s))
            & (col("_source_table", t) == col("_source_table", s))
            & (change_identity(col("_position", t)) == change_identity(col("_position", s))))
    merge = (once.alias(s).mergeInto(qualified(*name), same)
             .whenNotMatched().insert({qualified(c): col(c, s) for c in once.columns}))
    with SparkTxn(spark, version):
        merge.merge()
    return int(metrics_since(spark, *name, before).get("numTargetRowsInserted", 0))

