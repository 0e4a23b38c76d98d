"""A table's load plan, and one table's load from plan to its last chunk: where
its chunks' positions count (the source's lineage, placed before the load and checked
after it), and what the load did."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.load.loader import ChunkDone, LoadProgress, SlotJob, load_chunk, run_load
from binlog_assets.load.plan import LoadPlan, plan_load
from binlog_assets.load.reader import connect_reader, load_columns
from binlog_assets.parity.source import BinlogPosition, Snapshot, SourceTable

if TYPE_CHECKING:
    import pymysql

    from binlog_assets.config import PipelineConfig, SourceConfig
    from binlog_assets.load.direct import DirectTarget


@dataclass(frozen=True)
class TableLoad:
    table: str
    load_id: str
    chunks: int
    rows: int
    resumed_chunks: int
    seconds: float
    rows_per_second: float
    lineage: int
    highest: BinlogPosition | None


def new_plan(pipeline: PipelineConfig, db: pymysql.Connection, table: SourceTable
             ) -> LoadPlan:
    settings = pipeline.load
    return plan_load(db, table, settings.chunk_rows, settings.workers)


def load_table(pipeline: PipelineConfig, source: SourceConfig, db: pymysql.Connection,
               table: SourceTable, plan: LoadPlan, *,
               lineage: Callable[[BinlogPosition], int],
               progress: Callable[[LoadProgress, ChunkDone], None] = lambda p, c: None,
               direct: DirectTarget | None = None) -> TableLoad:
    """Load `plan`'s chunks of `table` not committed yet. `lineage` places a position
    read on `db` in the source's lineages: the load's chunks count in the lineage of
    the source's position before the load, and a load whose last position is in
    another (the source failed over meanwhile) fails, saying so. `direct`: the replica
    the chunks are appended to as well (`direct.prepare_direct`)."""
    placed = _placed(source, db, table, plan, lineage)
    state = run_load(ChangelogWriter(pipeline), source.connection, table, plan,
                     pipeline.load, placed, progress, direct)
    if state.highest is not None:  # some chunk read in this attempt
        after = lineage(state.highest)
        if after != placed:
            raise RuntimeError(
                f"{table.name}: the source moved from lineage {placed} to {after} during "
                f"the load (a failover): its chunks count in lineage {placed}; load it again")
    seconds = time.monotonic() - state.started
    return TableLoad(table.name, plan.load_id, state.chunks, state.rows, state.skipped,
                     seconds, state.rows_per_second, placed, state.highest)


def load_first_chunk(pipeline: PipelineConfig, source: SourceConfig, db: pymysql.Connection,
                     table: SourceTable, plan: LoadPlan, *,
                     lineage: Callable[[BinlogPosition], int]) -> ChunkDone:
    """The plan's first chunk into the changelog, as its worker slot would commit it:
    the rows a new replica is made of before a direct load appends the others."""
    placed = _placed(source, db, table, plan, lineage)
    job = SlotJob(ChangelogWriter(pipeline), source.connection, table, plan, 0, placed, 0.0)
    job.writer.ensure_table()
    reader = connect_reader(source.connection)
    try:
        return load_chunk(job, reader, load_columns(reader, table), 0, None)
    finally:
        reader.close()


def _placed(source: SourceConfig, db: pymysql.Connection, table: SourceTable, plan: LoadPlan,
            lineage: Callable[[BinlogPosition], int]) -> int:
    if source.connection is None:
        raise ValueError(f"source {source.name!r} has no `connection` to load from")
    if plan.table != table.name:
        raise ValueError(f"the plan {plan.load_id} is for {plan.table}, not {table.name}")
    with Snapshot(db) as before:
        pass
    return lineage(before)
