"""`resync_replica_job`: make a replica's rows of a key range equal to its source's, from
the launchpad, while streaming goes on (`parity/resync.py` has the rule: a re-synced
chunk counts at its snapshot's binlog position). The range is the one a failed parity
check names, `(lower, upper]`, as JSON arrays of the key's values; without one, the
whole table is re-synced chunk by chunk. Reads over the source's read-only connection,
writes with delta-rs: no Spark.
"""

import json
from collections.abc import Iterator

import dagster as dg
from pydantic import Field

from binlog_assets.orchestration.replica_reports import replica_key
from binlog_assets.orchestration.resources import BinlakeResource

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


@dg.op(name="resync_replica", description="Re-sync a replica's key range from its source.")
def resync_replica(context: dg.OpExecutionContext, config: ResyncConfig,
                   binlake: BinlakeResource) -> Iterator[dg.AssetMaterialization | dg.Output]:
    from binlog_assets.lakehouse.replica.routes import replica_route
    from binlog_assets.parity.check import own_route, sources_of
    from binlog_assets.parity.chunks import KeyRange
    from binlog_assets.parity.resync import resync_table
    from binlog_assets.parity.source import connect, source_tables

    pipeline = binlake.pipeline
    route = replica_route(pipeline, config.replica)
    lower, upper = _key(config.lower, "lower"), _key(config.upper, "upper")
    key_range = None if lower is None and upper is None else KeyRange(lower, upper)
    chunks = []
    for source in sources_of(pipeline, config.replica):
        if source.connection is None:
            raise ValueError(f"source {source.name!r} has no `connection` to read from")
        db = connect(source.connection)
        try:
            for table in source_tables(db, own_route(route, source)):
                if config.table and table.name != config.table:
                    continue
                done = resync_table(pipeline, config.replica, db, table, key_range)
                for c in done:
                    context.log.info(f"{table.name} {c.key_range.label()} at binlog "
                                     f"{c.position.name}:{c.position.pos}: {c.source_rows} "
                                     f"source rows, {c.written} written, {c.deleted} deleted")
                chunks += [(table.name, c) for c in done]
        finally:
            db.close()
    if not chunks:
        raise ValueError(f"no source table {config.table!r} of replica {config.replica!r}")
    yield dg.AssetMaterialization(
        asset_key=replica_key(config.replica),
        description="re-synced from the source",
        metadata={
            "resync_chunks": dg.MetadataValue.int(len(chunks)),
            "resync_rows_written": dg.MetadataValue.int(sum(c.written for _, c in chunks)),
            "resync_rows_deleted": dg.MetadataValue.int(sum(c.deleted for _, c in chunks)),
            "resync_ranges": dg.MetadataValue.json(
                [f"{t} {c.key_range.label()}" for t, c in chunks][:100]),
        })
    yield dg.Output(None)


@dg.job(name=RESYNC_JOB_NAME, executor_def=dg.in_process_executor,
        description="Make a replica's rows of a key range equal to its source's (launchpad: "
                    "replica, table, lower and upper keys as a failed parity check names "
                    "them), while streaming goes on.")
def resync_replica_job() -> None:
    resync_replica()
