"""A round's partitions handed out one at a time, to the round's threads that run them in
this process and to those that hand them to a worker process; each outcome kept."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING

from binlog_assets.consume.checkpoint import Checkpoint
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.rounds.partition import PartitionOutcome, run_partition
from binlog_assets.rounds.workers import consume_in_worker

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event

    from binlog_assets.rounds.plan import RunPlan
    from binlog_assets.rounds.round_commit import RoundCommit


class PartitionQueue:
    """A run's partitions handed out one at a time, until `stop`, to the threads that run
    them here (`run_here`) or in a worker process (`run_there`); `done` their outcomes."""

    def __init__(self, plan: RunPlan, handlers: HandlerRegistry | None,
                 metadata_checkpoint: Callable[[str], Checkpoint | None],
                 stop: threading.Event | Event, round_: RoundCommit | None) -> None:
        self.plan, self.handlers, self.stop, self.round = plan, handlers, stop, round_
        self.metadata_checkpoint = metadata_checkpoint
        self.todo = iter(plan.keys)
        self.taking = threading.Lock()
        self.done: dict[str, PartitionOutcome] = {}

    def take(self) -> str | None:
        with self.taking:
            return None if self.stop.is_set() else next(self.todo, None)

    def run_here(self) -> None:
        while (key := self.take()) is not None:
            partition = self.plan.partitions[key]
            try:
                if isinstance(partition, KeyError):
                    raise partition
                summary, sink = run_partition(
                    partition, self.handlers,
                    metadata_checkpoint=lambda key=key: self.metadata_checkpoint(key),
                    stop=self.stop, together=self.round)
                self.done[key] = PartitionOutcome(key, summary, sink)
            except Exception as exc:  # reported per partition by the caller
                self.done[key] = PartitionOutcome(key, error=exc)

    def run_there(self, processes: ProcessPoolExecutor) -> None:
        while (key := self.take()) is not None:
            partition = self.plan.partitions[key]
            if isinstance(partition, KeyError):  # no source: fails here as it would there
                self.done[key] = PartitionOutcome(key, error=partition)
                continue
            try:
                self.done[key] = processes.submit(
                    consume_in_worker, partition, self.metadata_checkpoint(key)).result()
            except Exception as exc:  # a worker died (BrokenProcessPool) or the like
                self.done[key] = PartitionOutcome(key, error=exc)
                return  # the pool is broken: the run's threads take the rest
