"""`resync_replica_job`: make a replica's rows of a key range equal to its source's, from
the launchpad, while streaming goes on (`parity/resync.py` has the rule: a re-synced
chunk counts at its snapshot's binlog position). The range is the one a failed parity
check names, `(lower, upper]`, as JSON arrays of the key's values; without one, the
whole table is re-synced chunk by chunk. The first op reads over the source's read-only
connection and appends the chunks to the changelog (delta-rs, no Spark); the second
applies the replica as a replica run would, in the `spark` pool, and reports it with its
row-count check, which then counts the re-synced rows on both sides.

With `parity.resync`, `parity_resync_sensor` launches it for each chunk a failed parity
check names, once per check.
"""

import json
from collections.abc import Iterator

import dagster as dg
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from pydantic import Field

from binlog_assets.config import PipelineConfig
from binlog_assets.orchestration.parity_checks import PARITY_CHECK, checked_replicas
from binlog_assets.orchestration.replica_reports import applied_events, replica_key
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import SPARK_POOL

RESYNC_JOB_NAME = "resync_replica_job"


class ResyncConfig(dg.Config):
    replica: str = Field(description="the replica to repair (as in `replica/<name>`)")
    table: str = Field("", description="the source table `db.table` (empty: every source "
                                       "table of the replica)")
    lower: str = Field("", description="the range's exclusive lower key as a JSON array, "
                                       "`[28]` (empty: unbounded)")
    upper: str = Field("", description="the range's inclusive upper key as a JSON array, "
                                       "`[53]` (empty: unbounded)")


def _key(text: str, field: str) -> tuple | None:
    if not text.strip():
        return None
    value = json.loads(text)
    if not isinstance(value, list) or not value:
        raise ValueError(f"{field}: {text!r} is not a non-empty JSON array of key values")
    return tuple(value)


@dg.op(name="resync_replica", out=dg.Out(dict),
       description="Re-sync a replica's key range from its source into the changelog.")
def resync_replica(context: dg.OpExecutionContext, config: ResyncConfig,
                   binlake: BinlakeResource) -> dict:
    from binlog_assets.parity.check import replica_sources
    from binlog_assets.parity.chunks import KeyRange
    from binlog_assets.parity.lineage import lineage_placer
    from binlog_assets.parity.resync import resync_table

    pipeline = binlake.pipeline
    lower, upper = _key(config.lower, "lower"), _key(config.upper, "upper")
    key_range = None if lower is None and upper is None else KeyRange(lower, upper)
    chunks = []
    for source, db, table in replica_sources(pipeline, config.replica, config.table):
        done = resync_table(pipeline, config.replica, db, table, key_range,
                            lineage=lineage_placer(pipeline, source, db, binlake.kafka_conf(),
                                                   pipeline.kafka["group.id"]))
        for c in done:
            context.log.info(f"{table.name} {c.key_range.label()} at binlog "
                             f"{c.position.name}:{c.position.pos}: {c.source_rows} "
                             f"source rows, {c.deleted} deleted, changelog version "
                             f"{c.version}")
        chunks += [(table.name, c) for c in done]
    if not chunks:
        raise ValueError(f"no source table {config.table!r} of replica {config.replica!r}")
    return {"replica": config.replica, "chunks": len(chunks),
            "source_rows": sum(c.source_rows for _, c in chunks),
            "deleted": sum(c.deleted for _, c in chunks),
            "ranges": [f"{t} {c.key_range.label()}" for t, c in chunks][:100]}


@dg.op(name="apply_resynced", pool=SPARK_POOL,
       description="Apply the re-synced rows to the replica and check its row count.")
def apply_resynced(context: dg.OpExecutionContext, resynced: dict, binlake: BinlakeResource
                   ) -> Iterator[dg.AssetMaterialization | dg.AssetCheckEvaluation | dg.Output]:
    yield from applied_events(binlake, resynced["replica"], "re-synced from the source", {
        "resync_chunks": dg.MetadataValue.int(resynced["chunks"]),
        "resync_source_rows": dg.MetadataValue.int(resynced["source_rows"]),
        "resync_rows_deleted": dg.MetadataValue.int(resynced["deleted"]),
        "resync_ranges": dg.MetadataValue.json(resynced["ranges"])}, context.log)
    yield dg.Output(None)


@dg.job(name=RESYNC_JOB_NAME, executor_def=dg.in_process_executor,
        description="Make a replica's rows of a key range equal to its source's (launchpad: "
                    "replica, table, lower and upper keys as a failed parity check names "
                    "them), while streaming goes on.")
def resync_replica_job() -> None:
    apply_resynced(resync_replica())


def parity_resync_sensor(pipeline: PipelineConfig) -> dg.SensorDefinition | None:
    """With `parity.resync`: a re-sync of each chunk a failed parity check found wrong,
    once per check (the check's event id is the cursor and the run keys)."""
    names = checked_replicas(pipeline)
    if not pipeline.parity.resync or not names:
        return None
    keys = {dg.AssetCheckKey(replica_key(n), PARITY_CHECK): n for n in names}

    @dg.sensor(name="parity_resync_sensor", job_name=RESYNC_JOB_NAME,
               minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
               description="Launches resync_replica_job for each chunk a failed parity "
                           "check found wrong (parity.resync).")
    def sensor(context: dg.SensorEvaluationContext) -> Iterator[dg.RunRequest | dg.SkipReason]:
        seen = int(context.cursor or 0)
        latest = context.instance.event_log_storage.get_latest_asset_check_execution_by_key(
            list(keys))
        # A check still running (planned) may end failed: the cursor stays below it.
        planned = [r.id for r in latest.values()
                   if r.status == AssetCheckExecutionRecordStatus.PLANNED]
        below = min(planned) if planned else None
        newest = seen
        for key, record in sorted(latest.items(), key=lambda kr: kr[1].id):
            if record.id <= seen or record.event is None or (
                    below is not None and record.id >= below):
                continue
            newest = max(newest, record.id)
            if record.status != AssetCheckExecutionRecordStatus.FAILED:
                continue
            evaluation = record.event.dagster_event.asset_check_evaluation_data
            yield from resync_requests(keys[key], record.id, evaluation.metadata, context.log)
        if newest == seen:
            yield dg.SkipReason("no parity check failed since the last tick")
        context.update_cursor(str(newest))

    return sensor


def resync_requests(replica: str, check_id: int, metadata: dict, log) -> Iterator[dg.RunRequest]:  # noqa: ANN001
    """A run request per chunk of a failed check's `mismatches` metadata: its range, or
    the whole table where the range has no exact JSON form; none for a log of changes."""
    entry = metadata.get("mismatches")
    wrong = entry.value if entry is not None else []
    whole: set[str] = set()
    for i, m in enumerate(wrong):
        if "lower" not in m:
            if m["range"].startswith("all rows"):
                log.info(f"{replica}: {m['table']} is a log of changes: a key range cannot "
                         f"re-sync it")
                continue
            if m["table"] in whole:
                continue
            whole.add(m["table"])
        bounds = {} if "lower" not in m else {
            "lower": "" if m["lower"] is None else json.dumps(m["lower"]),
            "upper": "" if m["upper"] is None else json.dumps(m["upper"])}
        yield dg.RunRequest(
            run_key=f"parity-{check_id}-{i}",
            run_config={"ops": {"resync_replica": {"config": {
                "replica": replica, "table": m["table"], **bounds}}}},
            tags={"binlake/resync": f"{replica} {m['table']} {m['range']}"})
