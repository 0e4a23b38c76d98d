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

import logging
import os
import pickle
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException

from binlog_assets.config import PipelineConfig
from binlog_assets.consume.checkpoint import Checkpoint
from binlog_assets.consume.lag import measure_lag
from binlog_assets.orchestration.partitions import parse_partition_key

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event
    
    from binlog_assets.lakehouse.changelog import ChangelogWriter
    from binlog_assets.orchestration.consume_runs import (
        ChangelogRunConfig,
        PartitionOutcome,
        PartitionPlan,
    )

log = logging.getLogger(__name__)

PARENT_CHECK_SECONDS = 0.5


@dataclass(frozen=True)
class SinkTotals:
    """What a worker's changelog sink reports back: rows appended, the last version."""

    rows: int
    version: int | None


@dataclass(frozen=True)
class WorkerRule:
    """The config's rule for a run's worker processes, resolved before the run starts."""

    wanted: int | None  # `dagster.worker_processes`; None: one per core beyond the first
    limit: int | None  # records a partition's run reads at most
    backlog_records: int  # `dagster.worker_backlog_records`

    @classmethod
    def of(cls, pipeline: PipelineConfig, run_config: ChangelogRunConfig) -> WorkerRule:
        return cls(pipeline.dagster.worker_processes,
                   run_config.max_records or pipeline.dagster.max_records_per_run,
                   pipeline.dagster.worker_backlog_records)

    def processes(self, kafka_conf: dict, keys: Sequence[str], group: str,
                  lags: Mapping[str, int] | None = None) -> int:
        """How many worker processes the run over `keys` uses: none for a single
        partition or a backlog below `backlog_records` (its group's committed offsets
        against the partitions' ends, each capped at `limit`). `lags`: each partition's
        lag as the caller has just measured it (a key it lacks has none), else measured
        here."""
        wanted = self.wanted
        if wanted is None:
            wanted = max(0, (os.cpu_count() or 1) - 1)
        wanted = min(wanted, len(keys) - 1)
        if wanted <= 0:
            return 0
        if lags is None:
            parsed = {parse_partition_key(k): k for k in keys}
            topics = sorted({t for t, _ in parsed})
            try:
                measured = measure_lag(kafka_conf, group, topics, check=False)
            except KafkaException as exc:
                # The run itself can still go on, in its own process.
                log.warning("no worker processes: the backlog of %s is unknown: %s",
                            topics, exc)
                return 0
            lags = {parsed[pl.topic, pl.partition]: pl.lag for pl in measured
                    if (pl.topic, pl.partition) in parsed}
        backlog = sum(lag if self.limit is None else min(lag, self.limit)
                      for lag in (lags.get(k, 0) for k in keys))
        return wanted if backlog >= self.backlog_records else 0


def worker_processes(pipeline: PipelineConfig, kafka_conf: dict, keys: Sequence[str],
                     run_config: ChangelogRunConfig, group: str,
                     lags: Mapping[str, int] | None = None) -> int:
    """`WorkerRule.processes` by the pipeline config."""
    return WorkerRule.of(pipeline, run_config).processes(kafka_conf, keys, group, lags)


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
    from binlog_assets.orchestration.consume_runs import PartitionOutcome, run_partition

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
