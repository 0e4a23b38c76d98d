"""An independent count of what a replica should hold, straight from the changelog.

`expected_live_rows` reduces the changelog rows routed to a replica, up to the changelog
version the replica has applied, without any of `ReplicaBuilder`'s machinery (no typing,
no MERGE): per key, the change with the highest position wins; the key is live when that
change is an insert, update or snapshot read and no truncate of its source table came
after it. The replica's `_current` view must hold exactly that many rows; the replica
asset's row-count check compares the two. An append-only replica must hold one row per
distinct change (`expected_log_rows`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from binlog_assets.config import PipelineConfig
from binlog_assets.formats.event import OP_CREATE, OP_DELETE, OP_READ, OP_TRUNCATE, OP_UPDATE
from binlog_assets.lakehouse.changelog_reader import read_changelog, read_survey
from binlog_assets.lakehouse.columns import change_identity, changelog_position
from binlog_assets.lakehouse.replica.routes import replica_route

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from binlog_assets.lakehouse.replica.routes import ReplicaRoute

_LIVE = (OP_CREATE, OP_UPDATE, OP_READ)
_ROW = (*_LIVE, OP_DELETE)


def expected_live_rows(spark: SparkSession, pipeline: PipelineConfig, replica: str,
                       applied_version: int) -> int:
    """Live keys of `replica` per the changelog as of `applied_version` (0 before any)."""
    route = replica_route(pipeline, replica)
    rows = _routed_rows(spark, pipeline, route, applied_version)
    if rows is None:
        return 0
    rows = rows.withColumn("_pos", changelog_position())
    if route.key_columns:
        image = F.coalesce(F.col("after"), F.col("before"))
        key = F.to_json(F.struct(*[F.get_json_object(image, f"$['{c}']").alias(c)
                                   for c in route.key_columns]))
    else:
        key = F.col("key")
    # Key ownership: without sharding, one key is one row whichever source table it
    # came from; with sharding the source table is part of the key.
    group = ["table", "_key"] if route.sharded else ["_key"]
    last = (rows.where(F.col("op").isin(*_ROW)).withColumn("_key", key)
            .groupBy(*group)
            .agg(F.max_by(F.struct("op", "table"), "_pos").alias("_last"),
                 F.max("_pos").alias("_pos"))
            .select("_last.op", F.col("_last.table").alias("table"), "_pos"))
    truncates = (rows.where(F.col("op") == OP_TRUNCATE).groupBy("table")
                 .agg(F.max("_pos").alias("_truncated")))
    live = (last.where(F.col("op").isin(*_LIVE)).join(truncates, "table", "left")
            .where(F.col("_truncated").isNull() | (F.col("_pos") > F.col("_truncated"))))
    return live.count()


def expected_log_rows(spark: SparkSession, pipeline: PipelineConfig, replica: str,
                      applied_version: int) -> int:
    """Distinct row changes and truncates of `replica`'s source tables per the changelog
    as of `applied_version`: the rows of its append-only replica (0 before any)."""
    rows = _routed_rows(spark, pipeline, replica_route(pipeline, replica), applied_version)
    if rows is None:
        return 0
    changes = rows.where(F.col("op").isin(*_ROW, OP_TRUNCATE))
    return changes.select("table", change_identity(changelog_position())).distinct().count()


def _routed_rows(spark: SparkSession, pipeline: PipelineConfig, route: ReplicaRoute,
                 applied_version: int) -> DataFrame | None:
    """The changelog's rows of the replica's source tables up to `applied_version`; None
    when there are none. The tables come from the commits' surveys in the log while the
    changelog is short, else from a scan of the rows (a Spark job)."""
    if applied_version < 0:
        return None
    rows = read_changelog(spark, pipeline, None, applied_version)
    groups = read_survey(spark, pipeline, None, applied_version)
    names = ({g.table for g in groups} if groups is not None
             else {r["table"] for r in rows.select("table").distinct().collect()})
    tables = route.select(names)
    return rows.where(F.col("table").isin(tables)) if tables else None
