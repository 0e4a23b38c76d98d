"""A replica's rows written by Spark: reduced per key and merged with the position
guard (`merge_replica`), after the changes below their table's truncate markers are
dropped (`above_truncates`, the rule `arrow_apply.above_marks` keeps without Spark)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql import types as T

from binlog_assets.config import PipelineConfig
from binlog_assets.faults import fault_point
from binlog_assets.formats.event import OP_TRUNCATE
from binlog_assets.identifiers import col, qualified
from binlog_assets.lakehouse.columns import (
    POSITION_TYPE,
    first_per_group,
    key_match,
    split_table,
    working_column,
)
from binlog_assets.lakehouse.delta_log import (
    create_table,
    create_with_rows,
    last_commit_metrics,
    merge_aliases,
    metrics_since,
    set_properties,
    stored_truncates,
    table_location,
    table_schema,
    table_version,
)
from binlog_assets.lakehouse.replica.arrow_commit import (
    arrow_commits,
    commit_rows,
)
from binlog_assets.lakehouse.replica.plan import (
    TRUNCATED_PROPERTY,
    ReplicaTable,
    RowShape,
    Stamp,
    Survey,
    marker_column,
)
from binlog_assets.lakehouse.replica.rewrite import rewrite_replica, rewrites
from binlog_assets.lakehouse.replica.rows import (
    below_truncates,
    typed_columns,
)
from binlog_assets.lakehouse.transactions import APP_ID, SparkTxn

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


# A truncate's watermark columns (source table and position) during an apply.
_MARK_DB, _MARK_TABLE, _MARK = (working_column(n) for n in ("mark_db", "mark_table", "mark"))


def watermarks(spark: SparkSession, table: tuple[str, str], survey: Survey, props: dict[str, str]
                ) -> list[tuple]:
    """(db, table, position) of every truncate: stored markers and the batch's."""
    marks: dict[tuple[str, str], tuple[int, ...]] = {}
    if props.get(TRUNCATED_PROPERTY) == "true":
        for db, name, position in stored_truncates(spark, table, marker_column(props)):
            marks[(db, name)] = position
    for name, position in survey.truncates.items():
        k = split_table(name)
        marks[k] = max(marks.get(k, position), position)
    return [(db, t, p) for (db, t), p in marks.items()]

def merge_replica(spark: SparkSession, pipeline: PipelineConfig, rows: DataFrame, *,
                  shape: RowShape, table: ReplicaTable, stamp: Stamp) -> tuple[int, int]:
    """Reduce per key, MERGE with the position guard; (rows written, rows truncated).

    `rows` are `keyed_rows`: the images are parsed after the reduce, for the changes
    that won it only. `table.new`: the replica does not exist yet and is created with
    them.
    """
    survey, key, new, name = shape.survey, shape.key, table.new, table.name
    up_to, now = stamp
    rows = above_truncates(spark, rows, survey, table=table)
    fault_point("during_replica_merge")
    # A small batch into an existing table: delta-rs commits it (`arrow_commit.py`),
    # whatever its size against the table's.
    limit = pipeline.lakehouse.arrow_commit_rows
    by_arrow = new is None and arrow_commits(table.props, survey.rows, limit,
                                             truncates=bool(survey.truncates))
    if not by_arrow and not table.empty and rewrites(spark, name, survey,
                                                     pipeline.lakehouse.rewrite_ratio):
        return rewrite_replica(spark, rows, table=table, shape=shape, version=up_to,
                               now=now)
    stored_columns = table_schema(spark, *name).names if new is None else new.columns
    reduced = (first_per_group(rows, [col(k) for k in key], [col("_position").desc()])
               .withColumn("_applied_at", F.lit(now)))
    reduced = typed_columns(reduced, stored_columns, shape=shape, live=True)
    if new is not None and arrow_commits(new.properties, survey.rows, limit,
                                         truncates=False):
        # The table by Spark (its catalog entry, schema and properties), its first rows
        # by delta-rs: a CTAS plans and writes them in Spark jobs of its own. A crash
        # in between leaves an empty replica, which the next apply appends to.
        create_table(spark, new.name, new.schema, new.properties, exists_ok=False)
        location = table_location(spark, *new.name)
        return commit_rows(location, reduced, key, APP_ID, up_to, merge=False), 0
    if new is not None:
        create_with_rows(spark, new, reduced, APP_ID, up_to)
        metrics = last_commit_metrics(spark, *name)
        return int(metrics.get("numOutputRows", 0)), 0
    if by_arrow:
        return commit_rows(table.location, reduced, key, APP_ID, up_to,
                           merge=not table.empty), 0
    before = table_version(spark, *name)
    if table.empty:
        # Nothing to match: the reduced batch is the table's content, appended with the
        # same transaction id (an initial build or a rebuild, without MERGE's joins).
        (reduced.write.format("delta").mode("append")
         .option("txnAppId", APP_ID).option("txnVersion", up_to)
         .saveAsTable(".".join(name)))
        metrics = metrics_since(spark, *name, before)
        return int(metrics.get("numOutputRows", 0)), 0
    t, s = merge_aliases(name)
    assignments = {qualified(c): col(c, s) for c in reduced.columns}
    merge = (reduced.alias(s).mergeInto(qualified(*name), key_match(key, t, s))
             .whenMatched(col("_position", s) > col("_position", t)).update(assignments)
             .whenNotMatched().insert(assignments))
    if survey.truncates:
        merge = (merge.whenNotMatchedBySource(below_truncates(survey.truncates, t))
                 .delete())
    with SparkTxn(spark, up_to):
        merge.merge()
    metrics = metrics_since(spark, *name, before)
    written = (int(metrics.get("numTargetRowsInserted", 0))
               + int(metrics.get("numTargetRowsMatchedUpdated", 0)))
    return written, int(metrics.get("numTargetRowsNotMatchedBySourceDeleted", 0))

def above_truncates(spark: SparkSession, rows: DataFrame, survey: Survey, *, table: ReplicaTable
                     ) -> DataFrame:
    """`rows` without the changes below their table's latest truncate: they are gone
    at the source already."""
    if (survey.truncates and table.new is None
            and table.props.get(TRUNCATED_PROPERTY) != "true"):
        # Set once, before the first marker lands, so that applies of replicas that
        # were never truncated skip looking for markers.
        set_properties(spark, table.name, {TRUNCATED_PROPERTY: "true"})
    marks = watermarks(spark, table.name, survey, table.props)
    if not marks:
        return rows
    wm = spark.createDataFrame(
        marks, T.StructType([T.StructField(_MARK_DB, T.StringType()),
                             T.StructField(_MARK_TABLE, T.StringType()),
                             T.StructField(_MARK, POSITION_TYPE)]))
    return (rows.join(F.broadcast(wm), (F.col("_source_db") == col(_MARK_DB))
                      & (F.col("_source_table") == col(_MARK_TABLE)), "left")
            .where((F.col("_op") == OP_TRUNCATE) | col(_MARK).isNull()
                   | (F.col("_position") > col(_MARK)))
            .drop(_MARK_DB, _MARK_TABLE, _MARK))

