"""Lakehouse maintenance from Dagster: `lakehouse_maintenance_job` deletes the changelog
rows past `lakehouse.changelog_retention_days` that every replica has applied, when set
(`lakehouse/retention.py`), compacts and vacuums the changelog and every replica (and
history) table (`lakehouse/maintenance.py`), and records for each table's asset an
observation with its files and bytes before and after (and the rows retention removed).
`lakehouse_maintenance_schedule` runs it nightly once turned on in the UI.

The op holds the `spark` pool's slot: replica builds and OPTIMIZE never race for a
replica's files (a follower run hands the slot over when this run waits for it). A run
whose Spark Connect server stops or restarts under it is retried (each step is
idempotent): a nightly run that failed would otherwise wait a day.
"""


from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import dagster as dg

from binlog_assets.orchestration.partitions import CHANGELOG_ASSET_KEY
from binlog_assets.orchestration.replica_reports import replica_key, replica_names
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import SPARK_POOL

if TYPE_CHECKING:  # the lakehouse modules load pyspark: imported where used
    from binlog_assets.lakehouse.maintenance import Upkeep
    from binlog_assets.lakehouse.retention import Retention

MAINTENANCE_JOB_NAME = "lakehouse_maintenance_job"
# A Spark Connect server restarting took 47-127 s under load on 2 cores.
SPARK_LOST_RETRIES = 3
SPARK_LOST_WAIT_SECONDS = 60.0


def upkeep_metadata(upkeep: "Upkeep") -> dict[str, dg.MetadataValue]:
    return {**_files_metadata(upkeep),
            "files_vacuumed": dg.MetadataValue.int(upkeep.files_vacuumed)}


def retention_metadata(kept: "Retention") -> dict[str, dg.MetadataValue]:
    applied = kept.applied_version
    return {
        **_files_metadata(kept),
        "step": dg.MetadataValue.text("retention"),
        "rows_removed": dg.MetadataValue.int(kept.rows_removed),
        "files_removed": dg.MetadataValue.int(kept.files_removed),
        "files_rewritten": dg.MetadataValue.int(kept.files_rewritten),
        "cutoff": dg.MetadataValue.timestamp(kept.cutoff),
        "applied_version": dg.MetadataValue.int(-1 if applied is None else applied),
    }


def _files_metadata(done: "Upkeep | Retention") -> dict[str, dg.MetadataValue]:
    md = {
        "table": dg.MetadataValue.text(done.table),
        "files_before": dg.MetadataValue.int(done.files_before),
        "files_after": dg.MetadataValue.int(done.files_after),
        "bytes_before": dg.MetadataValue.int(done.bytes_before),
        "bytes_after": dg.MetadataValue.int(done.bytes_after),
    }
    if done.note:
        md["note"] = dg.MetadataValue.text(done.note)
    return md


@dg.op(name="lakehouse_maintenance", pool=SPARK_POOL, out={},
       description="Delete the changelog rows past their retention that every replica "
                   "applied (when set), compact and vacuum the changelog and every "
                   "replica table.")
def lakehouse_maintenance(context: dg.OpExecutionContext, binlake: BinlakeResource
                          ) -> Iterator[dg.AssetObservation]:
    from binlog_assets.lakehouse.spark import forget_remote_session, remote_session_lost

    try:
        yield from _maintain(context, binlake)
    except Exception as exc:
        if not remote_session_lost(binlake.pipeline):
            raise
        forget_remote_session(binlake.pipeline)  # the retry opens a session anew
        context.log.warning(f"the Spark Connect server at {binlake.pipeline.spark.remote} "
                            f"stopped answering ({type(exc).__name__}): retrying in "
                            f"{SPARK_LOST_WAIT_SECONDS:.0f} s")
        raise dg.RetryRequested(max_retries=SPARK_LOST_RETRIES,
                                seconds_to_wait=SPARK_LOST_WAIT_SECONDS) from exc


def _maintain(context: dg.OpExecutionContext, binlake: BinlakeResource
              ) -> Iterator[dg.AssetObservation]:
    from binlog_assets.lakehouse.changelog_reader import changelog_version
    from binlog_assets.lakehouse.delta_log import table_exists
    from binlog_assets.lakehouse.maintenance import compact_changelog, compact_table
    from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
    from binlog_assets.lakehouse.retention import applied_by_every_replica, retain_changelog

    pipeline = binlake.pipeline
    builder = ReplicaBuilder(binlake.spark(), pipeline)
    names = replica_names(pipeline)
    current = changelog_version(builder.spark, pipeline)
    if current >= 0:
        # A replica behind the current version still reads older versions' files.
        behind = [n for n in names if (builder.applied_version(n) or -1) < current]
        if pipeline.lakehouse.changelog_retention_days is not None:
            # Before compaction, which would mix old rows into files of new ones.
            applied, waiting = applied_by_every_replica(builder, current)
            kept = retain_changelog(pipeline, applied)
            if waiting:
                kept = replace(kept, note=f"nothing removed: {', '.join(waiting)} "
                                          "applied no changelog version yet")
            context.log.info(f"{kept}")
            yield dg.AssetObservation(asset_key=CHANGELOG_ASSET_KEY,
                                      metadata=retention_metadata(kept))
        upkeep = compact_changelog(pipeline, vacuum=not behind)
        context.log.info(f"{upkeep}")
        yield dg.AssetObservation(asset_key=CHANGELOG_ASSET_KEY,
                                  metadata=upkeep_metadata(upkeep))
    for name in names:
        for table in (builder.table_name(name), builder.history_name(name)):
            if not table_exists(builder.spark, *table):
                continue
            upkeep = compact_table(builder.spark, pipeline, table)
            context.log.info(f"{upkeep}")
            yield dg.AssetObservation(asset_key=replica_key(name),
                                      metadata=upkeep_metadata(upkeep))


@dg.job(name=MAINTENANCE_JOB_NAME, executor_def=dg.in_process_executor,
        description="Changelog retention (when set), compaction and VACUUM of the "
                    "lakehouse tables (files and bytes before and after, and the rows "
                    "retention removed, are recorded on each table's asset).")
def lakehouse_maintenance_job() -> None:
    lakehouse_maintenance()


lakehouse_maintenance_schedule = dg.ScheduleDefinition(
    name="lakehouse_maintenance_schedule",
    job=lakehouse_maintenance_job,
    cron_schedule="30 3 * * *",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Off until turned on in the UI: nightly changelog retention (when set), "
                "compaction and VACUUM of the changelog and replicas "
                "(lakehouse_maintenance_job).",
)
