"""A table's initial load: its plan's chunks read by `workers` processes at once, each
chunk in its own consistent snapshot at binlog position P, appended to the changelog as
`r` events at P, exactly as a re-sync's rows (`parity/resync.py`):

- a chunk's row replaces the replica's row of its key where that row's `_position` is
  below P, and a change the stream brings at or past P wins over it, whichever the
  replica applies first: no lock, and the stream goes on during the load;
- the changelog stays the whole truth of the replica: a rebuild replays the load;
- each commit carries its worker slot's transaction (app id `binlake-load/<load>/<slot>`,
  version = chunk index + 1), so a load killed at any point resumes from each slot's
  last committed chunk and commits every chunk exactly once.

A load adds or replaces rows; it deletes none: a replica row whose key the source lacks
is the parity check's and re-sync's to find.
"""

from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from binlog_assets.load.reader import LoadColumns, connect_reader, load_columns, read_chunk

if TYPE_CHECKING:
    from binlog_assets.config.load import LoadConfig
    from binlog_assets.config.parity import SourceConnection
    from binlog_assets.lakehouse.changelog import ChangelogWriter
    from binlog_assets.load.direct import DirectTarget, ReplicaAppend
    from binlog_assets.load.plan import LoadPlan
    from binlog_assets.parity.source import BinlogPosition, SourceTable

APP_PREFIX = "binlake-load"


def slot_app_id(load_id: str, slot: int) -> str:
    return f"{APP_PREFIX}/{load_id}/{slot}"


@dataclass(frozen=True)
class ChunkDone:
    index: int
    rows: int
    position: BinlogPosition | None  # None: committed by an earlier attempt, not read
    version: int | None  # None: committed by an earlier attempt of the load
    seconds: float


@dataclass
class LoadProgress:
    """Where a load stands: what the UI plots and the run's log says."""

    chunks: int  # of the plan
    chunks_done: int = 0
    rows: int = 0
    started: float = field(default_factory=time.monotonic)
    skipped: int = 0  # chunks an earlier attempt committed
    highest: BinlogPosition | None = None

    @property
    def rows_per_second(self) -> float:
        return self.rows / max(time.monotonic() - self.started, 1e-9)

    @property
    def eta_seconds(self) -> float | None:
        read = self.chunks_done - self.skipped
        if read <= 0:
            return None
        per_chunk = (time.monotonic() - self.started) / read
        return per_chunk * (self.chunks - self.chunks_done)

    def describe(self) -> str:
        eta = self.eta_seconds
        return (f"{self.chunks_done}/{self.chunks} chunks, {self.rows:,} rows, "
                f"{self.rows_per_second:,.0f} rows/s"
                + ("" if eta is None else f", about {eta:.0f} s to go"))


@dataclass(frozen=True)
class SlotJob:
    """What one worker process needs: all of it pickles."""

    writer: ChangelogWriter
    connection: SourceConnection
    table: SourceTable
    plan: LoadPlan
    slot: int
    lineage: int
    pause_seconds: float
    direct: DirectTarget | None = None  # the replica the chunks are appended to as well


def run_load(writer: ChangelogWriter, connection: SourceConnection, table: SourceTable,
             plan: LoadPlan, settings: LoadConfig, lineage: int,
             progress: Callable[[LoadProgress, ChunkDone], None] = lambda p, c: None,
             direct: DirectTarget | None = None) -> LoadProgress:
    """Load every chunk of `plan` not committed yet; the load's progress at its end.
    `lineage` is the source lineage the chunks' positions count in (the caller places
    the source's position in it before and checks it after); `direct`: the replica the
    chunks from `direct.first` on are appended to as well (`direct.py`)."""
    jobs = [SlotJob(writer, connection, table, plan, slot, lineage, settings.pause_seconds,
                    direct) for slot in range(plan.workers)]
    state = LoadProgress(len(plan.uppers))

    def done(chunk: ChunkDone) -> None:
        state.chunks_done += 1
        state.rows += chunk.rows
        state.skipped += chunk.version is None
        if chunk.position is not None and (state.highest is None
                                           or chunk.position > state.highest):
            state.highest = chunk.position
        progress(state, chunk)

    if len(jobs) == 1:
        _load_slot(jobs[0], done)
        return state
    _in_processes(jobs, done)
    return state


def _in_processes(jobs: list[SlotJob], done: Callable[[ChunkDone], None]) -> None:
    """Each slot in a Python process of its own (`worker.py`), started afresh rather than
    forked: the parent may hold Spark's JVM and Kafka clients, and a script that calls
    the load needs no `__main__` guard. Job in by stdin, messages back by stdout."""
    messages: queue.Queue = queue.Queue()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    workers = []
    for job in jobs:
        proc = subprocess.Popen([sys.executable, "-m", "binlog_assets.load.worker"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        proc.stdin.write(pickle.dumps(job))
        proc.stdin.close()
        threading.Thread(target=_relay, args=(proc.stdout, job.slot, messages), daemon=True,
                         name=f"binlake-load-{job.slot}").start()
        workers.append(proc)
    finished = 0
    try:
        while finished < len(workers):
            kind, payload = messages.get()
            if kind == "chunk":
                done(payload)
            elif kind == "error":
                raise RuntimeError(f"a load worker failed:\n{payload}")
            elif kind == "eof":
                code = workers[payload].wait()
                if code != 0:
                    raise RuntimeError(f"load worker {payload} died (exit code {code})")
            else:
                finished += 1
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _relay(stream: Any, slot: int, messages: queue.Queue) -> None:
    try:
        while True:
            kind, payload = pickle.load(stream)
            messages.put((kind, payload))
            if kind in ("end", "error"):
                return
    except EOFError:  # the worker died without a word: the parent asks its exit code
        messages.put(("eof", slot))


def serve_slot(job: SlotJob, out: Any) -> None:
    """A worker process's life: its slot loaded, each message pickled to `out`."""
    def send(kind: str, payload: Any) -> None:
        pickle.dump((kind, payload), out)
        out.flush()

    try:
        _load_slot(job, lambda chunk: send("chunk", chunk))
    except BaseException:  # reported to the parent, which raises it
        send("error", traceback.format_exc())
        return
    send("end", job.slot)


def _load_slot(job: SlotJob, done: Callable[[ChunkDone], None]) -> None:
    """Slot `job.slot`'s chunks in order, each read in its snapshot and committed with
    the slot's transaction; chunks an earlier attempt committed are reported, not read.
    A direct chunk the changelog holds but the replica lacks (a kill between the two
    commits) is read again for the replica alone."""
    from deltalake import DeltaTable

    from binlog_assets.load.direct import ReplicaAppend

    plan, writer = job.plan, job.writer
    app_id = slot_app_id(plan.load_id, job.slot)
    writer.ensure_table()
    committed = DeltaTable(writer.uri).transaction_version(app_id) or 0
    db = connect_reader(job.connection)
    try:
        columns = load_columns(db, job.table)
        direct = None if job.direct is None else ReplicaAppend(job.direct, columns.names)
        in_replica = 0 if direct is None else direct.replica_version(app_id)
        for index in plan.slot_chunks(job.slot):
            straight = direct if direct is not None and index >= direct.target.first else None
            if index + 1 <= committed and (straight is None or index + 1 <= in_replica):
                done(ChunkDone(index, 0, None, None, 0.0))
                continue
            done(load_chunk(job, db, columns, index, straight,
                            changelog=index + 1 > committed))
            if job.pause_seconds:
                time.sleep(job.pause_seconds)
    finally:
        db.close()


def load_chunk(job: SlotJob, db: Any, columns: LoadColumns, index: int,
               direct: ReplicaAppend | None, *, changelog: bool = True) -> ChunkDone:
    """Chunk `index` read in its snapshot and committed with its slot's transaction: to
    the changelog (unless `changelog` is False: an earlier attempt committed it there),
    and with `direct`, its rows the replica takes appended to it too."""
    plan = job.plan
    app_id = slot_app_id(plan.load_id, job.slot)
    began = time.monotonic()
    now = datetime.now(UTC)
    rows: list[tuple] = []
    values: list[list] | None = None if direct is None else []
    read = read_chunk(db, job.table, columns, plan.chunk(index), (job.lineage, now), rows,
                      values, topic="" if direct is None else direct.target.topic)
    typed = None
    if direct is not None:
        rows, typed = direct.split(rows, values, now)
    version = None
    if changelog:
        loaded = None if typed is None else {direct.target.topic: typed.num_rows}
        version = job.writer.append_rows(rows, f"load/{plan.load_id}/{plan.table}/{index}",
                                         now, txn=(app_id, index + 1), loaded=loaded)
    if typed is not None:
        direct.append(typed, app_id, index + 1)
    if not changelog:  # for the replica alone: the changelog's rows are an earlier read's
        return ChunkDone(index, 0, None, None, time.monotonic() - began)
    return ChunkDone(index, read.rows, read.position, version, time.monotonic() - began)
