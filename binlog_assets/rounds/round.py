"""A consume round from the pipeline config to its report: its partitions planned
(`plan.py`), their bounded runs several at a time in one process (a large backlog also in
worker processes, `workers.py`), each writing the changelog through its fence with the
handlers its source names, opened once for the round (once per process), and the round's
report (`report.py`). What the changelog asset and the changelog follower hand a
round, and what tests, drills and benches run without Dagster around it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass

from binlog_assets.config import PipelineConfig
from binlog_assets.consume.checkpoint import Checkpoint
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.preflight import check_cluster
from binlog_assets.consume.run import RunSummary
from binlog_assets.consume.runtime import timed
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.lakehouse.fence import FencedChangelogSink
from binlog_assets.rounds.partition import PartitionOutcome, RunLimits, run_partition
from binlog_assets.rounds.plan import plan_run
from binlog_assets.rounds.queue import PartitionQueue
from binlog_assets.rounds.report import FreshGauge, Gauge, RoundReport
from binlog_assets.rounds.round_commit import commit_round, open_round
from binlog_assets.rounds.workers import worker_pool, worker_stop

# Partitions of one run consumed at the same time, each by its own consumer and lanes:
# their fixed costs (round trips to the coordinator and the leader, the Delta commits)
# overlap, while decoding shares the one interpreter anyway.
PARTITIONS_IN_PARALLEL = 4


def _no_checkpoint(key: str) -> Checkpoint | None:
    return None


def _ignore(report: RoundReport) -> None:
    return None


@dataclass(frozen=True)
class RoundOptions:
    """How a round runs beyond what the pipeline config says, all optional.

    `handlers`: the caller's registry for every partition, instead of the one each
    source names (then no worker process: the caller's objects live in this one).
    `metadata_checkpoint`: a partition's checkpoint as its latest materialization
    recorded it. `lags`: each partition's lag as the caller has just measured it, for
    the worker processes' backlog rule (`WorkerRule.processes`), which otherwise
    measures it. `together`: the partitions run in this process start from checkpoints
    read once for all and make their last commit points together (`RoundCommit`).
    `writer`: the changelog writer a caller keeps across rounds. `gauge`: how the
    report measures where the round left things. `on_interrupt`: what gets the report
    of an interrupted round."""

    handlers: HandlerRegistry | None = None
    metadata_checkpoint: Callable[[str], Checkpoint | None] = _no_checkpoint
    parallel: int = PARTITIONS_IN_PARALLEL
    lags: Mapping[str, int] | None = None
    together: bool = False
    writer: ChangelogWriter | None = None
    gauge: Gauge = FreshGauge()
    on_interrupt: Callable[[RoundReport], None] = _ignore


DEFAULT_OPTIONS = RoundOptions()


def consume_round(pipeline: PipelineConfig, kafka_conf: dict, keys: Sequence[str],
                  limits: RunLimits, *, group: str,
                  options: RoundOptions = DEFAULT_OPTIONS) -> RoundReport:
    """Bounded runs of every partition in `keys`, `options.parallel` at a time, each from
    its checkpoint to its end offset at its start, sharing one changelog writer and the
    handlers' clients; the round's report. A partition that fails does not stop the
    others: its outcome carries the error.

    Interrupted while it waits (Dagster terminates a run with SIGINT, raised here as
    `DagsterExecutionInterruptedError`), it starts no more partitions, stops those
    running at their next batch (each commits what its handlers finished), hands their
    report to `options.on_interrupt`, and raises the interrupt again."""
    plan = plan_run(pipeline, kafka_conf, keys, limits, group=group, writer=options.writer)
    keys, handlers = plan.keys, options.handlers
    # The threads start once the cluster is checked and the workers counted.
    # Refused credentials fail the run at once, named, instead of empty polls until the end.
    # A frozen broker answers late and raises nothing: the wait goes into the report.
    _, cluster_wait = timed(lambda: check_cluster(kafka_conf))
    threads = max(1, min(options.parallel, len(keys)))
    # Handlers given by the caller are objects of this process: only the config's
    # registries can be opened in another.
    workers = (plan.workers.processes(kafka_conf, group, plan.topic_partitions, options.lags)
               if handlers is None and len(keys) > 1 else 0)
    stop = worker_stop() if workers else threading.Event()

    with ExitStack() as opened:
        round_ = open_round(plan, opened) if options.together else None
        if isinstance(round_, Exception):  # no partition can start without its checkpoints
            return RoundReport(plan.report, [PartitionOutcome(key, error=round_)
                                             for key in keys], options.gauge, cluster_wait)
        for registry in [handlers] if handlers is not None else plan.registries:
            opened.enter_context(registry.opened())
        queue = PartitionQueue(plan, handlers, options.metadata_checkpoint, stop, round_)
        # Partitions run in threads even when there is one: the interrupt is raised in
        # this thread, which then asks them to stop instead of abandoning a commit.
        pool = opened.enter_context(ThreadPoolExecutor(
            max_workers=threads + workers, thread_name_prefix="binlake-partition"))
        futures = [pool.submit(queue.run_here) for _ in range(threads)]
        if workers:
            processes = opened.enter_context(worker_pool(workers, stop))
            futures += [pool.submit(queue.run_there, processes) for _ in range(workers)]
        interrupted: BaseException | None = None
        try:
            for future in futures:
                future.result()
        except BaseException as exc:
            stop.set()
            wait(futures)
            interrupted = exc
        commit_round(round_, queue.done)
        report = RoundReport(plan.report, [queue.done[key] for key in keys
                                           if key in queue.done], options.gauge, cluster_wait)
        if interrupted is not None:
            options.on_interrupt(report)
            raise interrupted
        return report


def consume_partitions(pipeline: PipelineConfig, kafka_conf: dict, keys: Sequence[str],
                       limits: RunLimits, *, group: str,
                       options: RoundOptions = DEFAULT_OPTIONS) -> list[PartitionOutcome]:
    """`consume_round`'s outcomes (its report measures nothing unless asked)."""
    return consume_round(pipeline, kafka_conf, keys, limits, group=group,
                         options=options).outcomes


def consume_partition(pipeline: PipelineConfig, kafka_conf: dict, key: str,
                      limits: RunLimits, handlers: HandlerRegistry | None = None, *,
                      group: str) -> tuple[RunSummary, FencedChangelogSink]:
    """One bounded consumer run of `key` into the changelog, in this thread: what the
    asset does for each of its partitions, without Dagster around it. `handlers`
    defaults to the registry the partition's source names in the config."""
    plan = plan_run(pipeline, kafka_conf, [key], limits, group=group)
    return run_partition(plan.partition(key), handlers)
