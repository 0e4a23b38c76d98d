"""Table upkeep: compaction and VACUUM of the changelog and the replicas, and the
purge of replicas' old tombstones.

Each consumer run adds a small changelog file and each apply rewrites replica files, so
without compaction reads and MERGEs slow down over a day. The changelog is compacted by
delta-rs (no JVM) with an empty survey in its commit metadata: the commit adds no rows,
and replica builds plan from surveys, so one without would make the next apply scan its
whole range. Replicas (and history tables) are compacted by Spark's `OPTIMIZE`, which
every table feature supports. VACUUM keeps every file that a version within
`lakehouse.vacuum_retention_hours` needs (Delta's own check refuses less than its
`deletedFileRetentionDuration`, 7 days by default, and binlake never turns it off). The
changelog is vacuumed only once every replica has applied its current version: a replica
that is behind reads the change feed of older versions, whose files compaction replaced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from binlog_assets.config import PipelineConfig
from binlog_assets.formats.event import OP_DELETE
from binlog_assets.identifiers import qualified, quote
from binlog_assets.lakehouse.changelog import changelog_uri
from binlog_assets.lakehouse.changelog_rows import commit_metadata
from binlog_assets.lakehouse.delta_log import (
    SPARK_ONLY_PROPERTIES,
    delta_rs_uri,
    metrics_since,
    open_log,
    set_properties,
    table_detail,
    table_location,
    table_version,
)
from binlog_assets.lakehouse.replica.plan import KEY_PROPERTY

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


PURGED_PROPERTY = "binlake.tombstones_purged_at"  # epoch seconds of the last purge
# A purge (a DELETE scanning the table's `_applied_at` statistics) runs at most once per
# this share of the retention window, so tombstones live between 1 and 1.1 windows.
PURGE_EVERY = 0.1


def purge_tombstones(spark: SparkSession, table: tuple[str, str], now: datetime,
                     props: dict[str, str], retention_hours: float) -> int:
    """Delete a replica's tombstones older than the window, when its last purge is old
    enough; returns how many. Delta prunes files by the `_applied_at` statistics and
    commits nothing when no row matches. `props`: the replica's properties, empty when
    this apply created it."""
    if not props:
        return 0
    window = timedelta(hours=retention_hours)
    last = float(props.get(PURGED_PROPERTY, "0"))
    if now.timestamp() - last < (window * PURGE_EVERY).total_seconds():
        return 0
    purged_at = {PURGED_PROPERTY: f"{now.timestamp():.3f}"}
    if not SPARK_ONLY_PROPERTIES.intersection(props):
        # delta-rs deletes as Spark's DELETE would (files pruned by the same statistics),
        # without the second or more of Spark planning a DELETE and an ALTER cost.
        log = open_log(table_location(spark, *table))
        cutoff = (now - window).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        metrics = log.delete(f"_op = '{OP_DELETE}' AND _applied_at < '{cutoff}'")
        set_properties(spark, table, purged_at)
        return int(metrics.get("num_deleted_rows", 0))
    before = table_version(spark, *table)
    # The session time zone is UTC (spark_conf), as the literal is read in it.
    cutoff = (now - window).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    spark.sql(f"DELETE FROM {qualified(*table)} WHERE _op = '{OP_DELETE}' "
              f"AND _applied_at < TIMESTAMP '{cutoff}'")
    purged = int(metrics_since(spark, *table, before).get("numDeletedRows", 0))
    set_properties(spark, table, purged_at)
    return purged


@dataclass(frozen=True)
class Upkeep:
    """What maintenance did to one table."""

    table: str
    files_before: int
    bytes_before: int
    files_after: int
    bytes_after: int
    files_vacuumed: int
    note: str = ""


def live_files(location: str) -> tuple[int, int]:
    """(data files, bytes) of the table's current version, from its log."""
    sizes = open_log(location).get_add_actions(flatten=True).column("size_bytes").to_pylist()
    return len(sizes), sum(sizes)


def compact_changelog(pipeline: PipelineConfig, *, vacuum: bool) -> Upkeep:
    """Compact the changelog (delta-rs); vacuum it too when `vacuum`."""
    from deltalake import CommitProperties, DeltaTable

    uri = changelog_uri(pipeline)
    before = live_files(uri)
    table = DeltaTable(delta_rs_uri(uri))
    table.optimize.compact(commit_properties=CommitProperties(
        custom_metadata={"userMetadata": commit_metadata("optimize", [])}))
    removed = (table.vacuum(retention_hours=int(pipeline.lakehouse.vacuum_retention_hours),
                            dry_run=False) if vacuum else [])
    after = live_files(uri)
    note = "" if vacuum else "not vacuumed: a replica has not applied the current version"
    return Upkeep(qualified(pipeline.lakehouse.database, "changelog"), *before, *after,
                  len(removed), note)


def compact_table(spark: SparkSession, pipeline: PipelineConfig, table: tuple[str, str]
                  ) -> Upkeep:
    """OPTIMIZE and VACUUM a replica or history table; with `lakehouse.zorder_replicas`,
    OPTIMIZE clusters it by its key (`ZORDER BY`)."""
    location = table_location(spark, *table)
    before = live_files(location)
    name = qualified(*table)
    zorder = []
    if pipeline.lakehouse.zorder_replicas:
        properties = table_detail(spark, *table)["properties"]
        zorder = json.loads(properties.get(KEY_PROPERTY, "[]"))
    order = f" ZORDER BY ({', '.join(quote(c) for c in zorder)})" if zorder else ""
    spark.sql(f"OPTIMIZE {name}{order}").collect()
    hours = int(pipeline.lakehouse.vacuum_retention_hours)
    # VACUUM answers with the table's path; its DRY RUN lists what it would delete.
    removed = spark.sql(f"VACUUM {name} RETAIN {hours} HOURS DRY RUN").count()
    spark.sql(f"VACUUM {name} RETAIN {hours} HOURS").collect()
    return Upkeep(name, *before, *live_files(location), removed)
