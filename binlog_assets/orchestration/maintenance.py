"""Lakehouse maintenance from Dagster: `lakehouse_maintenance_job` compacts and vacuums
the changelog and every replica (and history) table (`lakehouse/maintenance.py`), and
records for each table's asset an observation with its files and bytes before and
after. `lakehouse_maintenance_schedule` runs it nightly once turned on in the UI.

The op holds the `spark` pool's slot: replica builds and OPTIMIZE never race for a
replica's files (a follower run hands the slot over when this run waits for it).
"""


from collections.abc import Iterator

import dagster as dg

from binlog_assets.orchestration.partitions import CHANGELOG_ASSET_KEY
from binlog_assets.orchestration.replica_reports import replica_key, replica_names
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import SPARK_POOL

MAINTENANCE_JOB_NAME = "lakehouse_maintenance_job"


def upkeep_metadata(upkeep) -> dict[str, dg.MetadataValue]:  # noqa: ANN001 - an Upkeep
    md = {
        "table": dg.MetadataValue.text(upkeep.table),
        "files_before": dg.MetadataValue.int(upkeep.files_before),
        "files_after": dg.MetadataValue.int(upkeep.files_after),
        "bytes_before": dg.MetadataValue.int(upkeep.bytes_before),
        "bytes_after": dg.MetadataValue.int(upkeep.bytes_after),
        "files_vacuumed": dg.MetadataValue.int(upkeep.files_vacuumed),
    }
    if upkeep.note:
        md["note"] = dg.MetadataValue.text(upkeep.note)
    return md


@dg.op(name="lakehouse_maintenance", pool=SPARK_POOL, out={},
       description="Compact and vacuum the changelog and every replica table.")
def lakehouse_maintenance(context: dg.OpExecutionContext, binlake: BinlakeResource
                          ) -> Iterator[dg.AssetObservation]:
    from binlog_assets.lakehouse.changelog_reader import changelog_version
    from binlog_assets.lakehouse.delta_log import table_exists
    from binlog_assets.lakehouse.maintenance import compact_changelog, compact_table
    from binlog_assets.lakehouse.replica import ReplicaBuilder

    cfg = binlake.pipeline
    builder = ReplicaBuilder(binlake.spark(), cfg)
    names = replica_names(cfg)
    current = changelog_version(builder.spark, cfg)
    if current >= 0:
        # A replica behind the current version still reads older versions' files.
        behind = [n for n in names if (builder.applied_version(n) or -1) < current]
        upkeep = compact_changelog(cfg, vacuum=not behind)
        context.log.info(f"{upkeep}")
        yield dg.AssetObservation(asset_key=CHANGELOG_ASSET_KEY,
                                  metadata=upkeep_metadata(upkeep))
    for name in names:
        for table in (builder.table_name(name), builder.history_name(name)):
            if not table_exists(builder.spark, *table):
                continue
            upkeep = compact_table(builder.spark, cfg, table)
            context.log.info(f"{upkeep}")
            yield dg.AssetObservation(asset_key=replica_key(name),
                                      metadata=upkeep_metadata(upkeep))


@dg.job(name=MAINTENANCE_JOB_NAME, executor_def=dg.in_process_executor,
        description="Compact and vacuum the lakehouse tables (files and bytes before and "
                    "after are recorded on each table's asset).")
def lakehouse_maintenance_job() -> None:
    lakehouse_maintenance()


lakehouse_maintenance_schedule = dg.ScheduleDefinition(
    name="lakehouse_maintenance_schedule",
    job=lakehouse_maintenance_job,
    cron_schedule="30 3 * * *",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Off until turned on in the UI: nightly compaction and VACUUM of the "
                "changelog and replicas (lakehouse_maintenance_job).",
)
