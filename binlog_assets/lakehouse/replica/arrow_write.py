"""An apply's Arrow way: the batch reduced and typed as Arrow (`arrow_apply.py`),
committed by delta-rs (`arrow_commit.py`); into a new replica after Spark's CREATE
TABLE; its versions merged into the history table (`history_arrow.py`) when it has one
behind."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from binlog_assets.faults import fault_point
from binlog_assets.lakehouse.delta_log import create_table, open_log, table_location
from binlog_assets.lakehouse.maintenance import purge_tombstones
from binlog_assets.lakehouse.replica import merge as replica_merge
from binlog_assets.lakehouse.replica.arrow_apply import (
    above_marks,
    arrow_rows,
    batch_changes,
    history_changes,
)
from binlog_assets.lakehouse.replica.arrow_commit import commit_appended, commit_arrow
from binlog_assets.lakehouse.replica.history_arrow import merge_history_versions
from binlog_assets.lakehouse.replica.loads import recorded_loads
from binlog_assets.lakehouse.replica.tables import history_name
from binlog_assets.lakehouse.transactions import APP_ID

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from binlog_assets.config import PipelineConfig
    from binlog_assets.lakehouse.replica.plan import KeyRule, ReplicaTable, RowShape, Versions


def write_arrow(spark: SparkSession, pipeline: PipelineConfig, rule: KeyRule, *,
                shape: RowShape, table: ReplicaTable, versions: Versions) -> dict[str, int]:
    """The batch written the Arrow way (see the module docstring); raises `NeedsSpark`
    before any commit where only Spark reproduces it. Returns the counts of the apply's
    result."""
    import pyarrow as pa

    now = datetime.now(UTC)
    route, survey, columns = shape.route, shape.survey, shape.columns
    new, location, up_to = table.new, table.location, versions.up_to
    schema = new.schema if new is not None else (
        pa.schema(open_log(location).schema().to_arrow()))
    batch = batch_changes(pipeline, versions.start, up_to, survey, rule,
                          sorted(recorded_loads(table.props)))
    # The history keeps every version, as Spark's way does; a keyed replica drops
    # changes below its truncates, stored and the batch's, as Spark's apply does (an
    # append-only one logs them all).
    marks = ([] if rule.append
             else replica_merge.watermarks(spark, table.name, survey, table.props))
    rows = arrow_rows(above_marks(batch, marks), survey, rule, columns, schema, now)
    history = history_name(table.name[0], route.replica)
    # Typed before any commit: a value only Spark types sends the whole batch there.
    history_rows = (history_changes(batch, survey, rule.key, columns, now)
                    if route.history and history in versions.behind else None)
    fault_point("during_replica_merge")
    if new is not None:
        create_table(spark, new.name, new.schema, new.properties, exists_ok=False)
        location = table_location(spark, *new.name)
    merge = new is None and not table.empty
    if rule.append:  # a log of changes: no live rows, no view, no tombstones
        return {"written": commit_appended(location, rows, APP_ID, up_to, merge=merge)}
    # Behind alone when a crash came between the replica's commit and its history's.
    written = (commit_arrow(location, rows, rule.key, APP_ID, up_to, merge=merge)
               if table.name in versions.behind else 0)
    if history_rows is not None:
        merge_history_versions(table_location(spark, *history), history_rows,
                               rule.key, APP_ID, up_to)
    return {"written": written,
            "tombstones": purge_tombstones(spark, table.name, now, table.props,
                                           pipeline.lakehouse.tombstone_retention_hours)}
