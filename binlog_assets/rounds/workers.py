"""Worker processes for a consumer run with a large backlog.

A run decodes in one interpreter, which keeps one core busy however many partitions it
reads at a time. A run whose partitions hold at least `dagster.worker_backlog_records`
records to read also hands partitions to worker processes (`dagster.worker_processes`,
by default one per core beyond the first): each takes the next partition not started
yet, as the run's own threads do, and runs it exactly as they would (its own consumer,
tracker and fence, the changelog written by delta-rs), opening the handlers its source
names in that process. Only what the run reports comes back: the partition's summary
and its changelog totals.

A worker stops when the run's process is gone (killed, say), within a second; what it
was doing is then what a killed run leaves, which the next run takes over as always. An
interrupted run (Dagster's termination) stops its workers' partitions as its own, at
their next batch, with what their handlers finished committed.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import get_context
from typing import TYPE_CHECKING

from binlog_assets.config import PipelineConfig
from binlog_assets.consume.backlog import WorkerRule
from binlog_assets.consume.checkpoint import Checkpoint
from binlog_assets.rounds.partition import (
    PartitionOutcome,
    PartitionPlan,
    RunLimits,
    SinkTotals,
    run_partition,
)

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event
    
    from binlog_assets.lakehouse.changelog import ChangelogWriter


PARENT_CHECK_SECONDS = 0.5


def worker_rule(pipeline: PipelineConfig, run_config: RunLimits) -> WorkerRule:
    """The config's rule for the worker processes of a run with `run_config`'s limits."""
    return WorkerRule(pipeline.dagster.worker_processes,
                      run_config.max_records or pipeline.dagster.max_records_per_run,
                      pipeline.dagster.worker_backlog_records)


def worker_stop() -> Event:
    """The run's stop signal, shared with its worker processes (`worker_pool`)."""
    return get_context("spawn").Event()


def worker_pool(processes: int, stop: Event) -> ProcessPoolExecutor:
    """Fresh interpreters (not forks of a process running librdkafka's threads), each
    watching that the run's process is still there, and stopping its partition when
    the run sets `stop` (from `worker_stop`)."""
    return ProcessPoolExecutor(processes, mp_context=get_context("spawn"),
                               initializer=_start_worker, initargs=(os.getpid(), stop))


_STOP: list = []  # the run's stop signal, in a worker process


def _start_worker(parent: int, stop: Event) -> None:
    # An interrupt is the run's to handle (a Ctrl-C reaches the whole process group):
    # the run tells its workers to stop through `stop`, and they commit what is done.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _STOP.append(stop)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(1)  # the run is gone: nobody would report this partition's outcome

    threading.Thread(target=watch, name="binlake-parent-watch", daemon=True).start()


def consume_in_worker(plan: PartitionPlan, checkpoint: Checkpoint | None
                      ) -> PartitionOutcome:
    """One partition's bounded run in a worker process (`run_partition` with the
    handlers its source names), as a picklable outcome."""

    try:
        summary, sink = run_partition(replace(plan, writer=_writer(plan.writer)),
                                      metadata_checkpoint=lambda: checkpoint,
                                      stop=_STOP[0] if _STOP else None)
    except Exception as exc:  # reported per partition by the run, as in its own threads
        return PartitionOutcome(plan.key, error=_picklable(exc))
    return PartitionOutcome(plan.key, summary, SinkTotals(sink.rows, sink.version))


_WRITERS: dict[str, ChangelogWriter] = {}


def _writer(sent: ChangelogWriter) -> ChangelogWriter:
    """One changelog writer per worker process and lakehouse, as the run has one: `sent`
    arrives anew with each partition, unopened."""
    return _WRITERS.setdefault(sent.uri, sent)


def _picklable(exc: Exception) -> Exception:
    """`exc` when it survives the trip to the run's process, else its text in one that
    does, its type named."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # any failure to round-trip means: send the text
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc
