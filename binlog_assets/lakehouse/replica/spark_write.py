"""An apply's Spark way, for a batch the Arrow way does not take: the changes appended
to an append-only replica (`append_replica.py`), or the keyed rows (`rows.keyed_rows`,
with drop markers and cut-overs) merged into the replica (`merge.py`) and its history
table (`history.py`), each where behind."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from binlog_assets.faults import fault_point
from binlog_assets.lakehouse.delta_log import table_schema
from binlog_assets.lakehouse.maintenance import purge_tombstones
from binlog_assets.lakehouse.replica import merge as replica_merge
from binlog_assets.lakehouse.replica.cutover import cutover_rows
from binlog_assets.lakehouse.replica.ddl_apply import drop_markers, move_batch_rows
from binlog_assets.lakehouse.replica.plan import MERGED_OPS, Stamp
from binlog_assets.lakehouse.replica.routes import SOURCE_KEY_COLUMNS
from binlog_assets.lakehouse.replica.rows import (
    keyed_changes,
    keyed_rows,
    row_image,
    typed_columns,
)
from binlog_assets.lakehouse.replica.tables import history_name
from binlog_assets.lakehouse.transactions import SparkTxn

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from binlog_assets.config import PipelineConfig
    from binlog_assets.lakehouse.replica.batch import BatchPlan
    from binlog_assets.lakehouse.replica.plan import ReplicaTable, RowShape, Versions
    from binlog_assets.lakehouse.replica.tables import Prepared


def append_rows(spark: SparkSession, batch: DataFrame, stamp: Stamp, *, shape: RowShape,
                table: ReplicaTable) -> int:
    """The batch's changes appended to an append-only replica; the rows written."""
    from binlog_assets.lakehouse.append_replica import append_changes

    survey = shape.survey
    rows = keyed_changes(batch.where(F.col("table").isin(survey.tables)
                                     & F.col("op").isin(*MERGED_OPS)),
                         row_image(), F.col("op"), shape=shape, image_first=False)
    stored_columns = (table_schema(spark, *table.name).names
                      if table.new is None else table.new.columns)
    fault_point("during_replica_merge")
    return append_changes(spark, rows,
                          lambda frame: typed_columns(frame, stored_columns, shape=shape),
                          table=table, version=stamp.version, now=stamp.at)


def merge_keyed(spark: SparkSession, pipeline: PipelineConfig, plan: BatchPlan,
                prepared: Prepared, *, versions: Versions, now: datetime) -> dict[str, int]:
    """The batch's rows for a keyed replica merged into it and its history table, where
    behind; a new replica's rows are built under the names they have now. Returns the
    counts of the apply's result."""
    from binlog_assets.lakehouse.history import merge_history

    shape, table = prepared.shape, prepared.table
    route, survey = shape.route, shape.survey
    stamp = Stamp(versions.up_to, now)
    rows = keyed_rows(move_batch_rows(plan.batch.frame(), plan.ddl, route, survey),
                      shape=shape)
    if route.on_drop == "truncate":
        rows = drop_markers(spark, rows, prepared.sources, survey)
    if plan.cutovers:
        rows = cutover_rows(spark, rows, plan.cutovers, shape=shape)
    if route.history:
        rows = rows.persist()
    try:
        written = truncated = 0
        if table.name in versions.behind:
            written, truncated = replica_merge.merge_replica(
                spark, pipeline, rows, shape=shape, table=table, stamp=stamp)
        history = history_name(table.name[0], route.replica)
        if route.history and history in versions.behind:
            typed = typed_columns(rows, [*SOURCE_KEY_COLUMNS, *shape.columns, "_position",
                                         "_op", "_source_ts"], shape=shape)
            with SparkTxn(spark, stamp.version):
                merge_history(spark, history, typed, shape.key, survey.truncates, stamp.at)
    finally:
        if route.history:
            rows.unpersist()
    return {"written": written, "truncated": truncated,
            "tombstones": purge_tombstones(spark, table.name, stamp.at, table.props,
                                           pipeline.lakehouse.tombstone_retention_hours)}
