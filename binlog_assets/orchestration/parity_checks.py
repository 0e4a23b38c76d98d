"""The `parity` asset check of each replica whose source has a `connection`, the job that
runs it over replicas chosen in the launchpad, and its optional schedule.

The check reads the source over its read-only connection and the replica by delta-rs:
no Spark, so it takes no slot of the Spark pool. A failed check has ERROR severity (a
replica that differs from its source is wrong data, not a late one) and names the
differing keys. It does not run inside a replica build (`build_replicas_job` selects the
replicas' checks with them): a build applies, the check is launched on its own.
"""

from collections.abc import Iterator

import dagster as dg
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from pydantic import Field

from binlog_assets.config import PipelineConfig
from binlog_assets.orchestration.replica_reports import replica_key, replica_names
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import BUILD_JOB_NAME

PARITY_CHECK = "parity"
PARITY_JOB_NAME = "parity_check_job"


class ParityRunConfig(dg.Config):
    replicas: list[str] = Field(
        default_factory=list,
        description="replicas to check (names, as in `replica/<name>`); empty: every "
                    "replica the run selects")


def checked_replicas(pipeline: PipelineConfig) -> list[str]:
    """Replicas with a parity check: those whose sources all have a connection."""
    out = []
    for name in replica_names(pipeline):
        tables = [(s, t) for s in pipeline.sources for t in s.tables if t.replica == name]
        if all(s.connection is not None for s, _ in tables):
            out.append(name)
    return out


def failed_parity(instance: dg.DagsterInstance, pipeline: PipelineConfig) -> list[str]:
    """Checked replicas whose latest parity check failed: what `parity.block_dbt` holds
    dbt back for, until a later check passes."""
    keys = {dg.AssetCheckKey(replica_key(n), PARITY_CHECK): n for n in checked_replicas(pipeline)}
    if not keys:
        return []
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(list(keys))
    return sorted(keys[k] for k, record in latest.items()
                  if record.status == AssetCheckExecutionRecordStatus.FAILED)


def parity_held_message(failed: list[str]) -> str:
    return (f"the parity check of {', '.join(failed)} failed (parity.block_dbt): dbt waits "
            f"until a re-sync (resync_replica_job) makes them check equal")


def parity_result(key: dg.AssetKey, report, sample: int) -> dg.AssetCheckResult:  # noqa: ANN001
    """A ParityReport as the check's result and metadata."""
    md = {
        "chunks": dg.MetadataValue.int(report.chunks),
        "source_rows": dg.MetadataValue.int(report.source_rows),
        "replica_rows": dg.MetadataValue.int(report.replica_rows),
        "mismatched_chunks": dg.MetadataValue.int(len(report.mismatches)),
        "rechecked_chunks": dg.MetadataValue.int(report.rechecked),
        "seconds": dg.MetadataValue.float(round(report.seconds, 3)),
        "source_seconds": dg.MetadataValue.float(round(report.source_seconds, 3)),
        "replica_seconds": dg.MetadataValue.float(round(report.replica_seconds, 3)),
        "wait_seconds": dg.MetadataValue.float(round(report.wait_seconds, 3)),
        "snapshot": dg.MetadataValue.text(report.snapshot),
        "applied_past_snapshot": dg.MetadataValue.text(report.progress),
        "tables": dg.MetadataValue.json(report.tables),
    }
    if report.mismatches:
        md["differing_keys"] = dg.MetadataValue.json(report.sample_keys(sample))
        md["mismatches"] = dg.MetadataValue.json([
            {"table": m.table, "range": m.key_range, "source_rows": m.source_rows,
             "replica_rows": m.replica_rows, **_bounds(m)} for m in report.mismatches][:100])
    if report.skipped_columns:
        md["columns_not_compared"] = dg.MetadataValue.json(report.skipped_columns)
    if report.single_chunk_tables:
        # Their key orders differently in MariaDB and Python, or has no index.
        md["single_chunk_tables"] = dg.MetadataValue.json(report.single_chunk_tables)
    return dg.AssetCheckResult(
        asset_key=key, check_name=PARITY_CHECK, passed=report.passed,
        severity=dg.AssetCheckSeverity.ERROR, metadata=md, description=report.summary())


def _bounds(mismatch) -> dict:  # noqa: ANN001 - a parity.check.Mismatch
    """The chunk's `lower` and `upper` keys as JSON arrays (null: unbounded), as
    `resync_replica_job` takes them; left out when a key value has no exact JSON form (a
    date, a decimal) or the table is a log of changes."""
    bounds = mismatch.bounds
    if bounds is None:
        return {}
    ends = [bounds.lower, bounds.upper]
    if any(v is not None and not all(type(x) in (int, str) for x in v) for v in ends):
        return {}
    return {"lower": None if bounds.lower is None else list(bounds.lower),
            "upper": None if bounds.upper is None else list(bounds.upper)}


def build_parity_checks(pipeline: PipelineConfig) -> list[dg.AssetChecksDefinition]:
    names = checked_replicas(pipeline)
    if not names:
        return []
    specs = [dg.AssetCheckSpec(
        PARITY_CHECK, asset=replica_key(name),
        description="the replica's live rows equal its source tables, chunk by chunk "
                    "(checksums taken by the source server in consistent snapshots, "
                    "compared once the replica applied past them)")
        for name in names]

    @dg.multi_asset_check(specs=specs, can_subset=True, name="parity_checks")
    def parity_checks(context: dg.AssetCheckExecutionContext, config: ParityRunConfig,
                      binlake: BinlakeResource) -> Iterator[dg.AssetCheckResult]:
        from binlog_assets.parity.check import NotCheckable, check_replica

        if _builds_replicas(context):
            context.log.info("parity: not checked in a run that builds replicas; launch "
                             f"{PARITY_JOB_NAME}")
            return
        pipeline = binlake.pipeline
        chosen = set(config.replicas)
        unknown = chosen - set(names)
        if unknown:
            raise ValueError(f"replicas {sorted(unknown)} have no parity check; checked "
                             f"replicas: {names}")
        for check in sorted(context.selected_asset_check_keys, key=lambda k: k.asset_key.path):
            name = check.asset_key.path[-1]
            if chosen and name not in chosen:
                continue
            try:
                report = check_replica(pipeline, name, binlake.kafka_conf(),
                                       binlake.group_id(), log=context.log.info)
            except NotCheckable as exc:
                yield dg.AssetCheckResult(
                    asset_key=check.asset_key, check_name=PARITY_CHECK, passed=False,
                    severity=dg.AssetCheckSeverity.WARN, description=f"not checked: {exc}")
                continue
            context.log.info(f"parity {name}: {report.summary()} in {report.seconds:.1f}s")
            yield parity_result(check.asset_key, report, pipeline.parity.sample_keys)

    return [parity_checks]


def _builds_replicas(context: dg.AssetCheckExecutionContext) -> bool:
    op = context.op_execution_context
    selection = op.run.asset_selection or set()
    return op.job_name == BUILD_JOB_NAME or any(
        k.path[0] == "replica" for k in selection)


def parity_job(pipeline: PipelineConfig):  # noqa: ANN201 - an unresolved asset job, or None
    names = checked_replicas(pipeline)
    if not names:
        return None
    return dg.define_asset_job(
        name=PARITY_JOB_NAME,
        selection=dg.AssetSelection.checks(
            *(dg.AssetCheckKey(replica_key(n), PARITY_CHECK) for n in names)),
        description="The parity check of replicas against their source database: "
                    "choose replicas in the launchpad "
                    "(ops.parity_checks.config.replicas), or leave it empty for all.",
        executor_def=dg.in_process_executor,
    )


def parity_schedule(pipeline: PipelineConfig, job) -> dg.ScheduleDefinition | None:  # noqa: ANN001
    if job is None or pipeline.parity.schedule is None:
        return None
    return dg.ScheduleDefinition(
        name="parity_check_schedule", job=job, cron_schedule=pipeline.parity.schedule,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Off until turned on in the UI: then checks every replica against its "
                    "source on parity.schedule.")
