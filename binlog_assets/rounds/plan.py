"""A consume round: one bounded consumer run per topic-partition, several at a time in
one process (`consume_partitions`; a large backlog also in worker processes,
`rounds/workers.py`), each writing the changelog through its fence, with the handlers
its source's config names, opened once for the run (once per process).

What a run takes from the pipeline config is resolved once, before it starts
(`plan_run`): the partitions' runs are handed their plans, not the config, and the
run's reports what they need (`RunReport`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

from binlog_assets.config import PipelineConfig, SourceConfig
from binlog_assets.consume.backlog import WorkerRule
from binlog_assets.consume.checkpoint import Checkpoint
from binlog_assets.consume.errors import ErrorPolicy
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.preflight import check_cluster
from binlog_assets.consume.run import RunSettings, RunSummary, Stop
from binlog_assets.lakehouse.changelog import (
    ChangelogWriter,
    changelog_uri,
)
from binlog_assets.lakehouse.fence import FencedChangelogSink
from binlog_assets.rounds.keys import parse_partition_key
from binlog_assets.rounds.partition import (
    PartitionOutcome,
    PartitionPlan,
    RunLimits,
    run_partition,
)
from binlog_assets.rounds.round_commit import RoundCommit
from binlog_assets.rounds.workers import (
    consume_in_worker,
    worker_pool,
    worker_rule,
    worker_stop,
)

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event

# Partitions of one run consumed at the same time, each by its own consumer and lanes:
# their fixed costs (round trips to the coordinator and the leader, the Delta commits)
# overlap, while decoding shares the one interpreter anyway.
PARTITIONS_IN_PARALLEL = 4



@dataclass(frozen=True)
class RunReport:
    """What the run's reports need, taken from the pipeline config with the run's plan:
    the reports then pass on no config of their own."""

    kafka_conf: dict
    group: str
    sources: list[SourceConfig]  # those of the run's partitions
    topics: list[str]  # theirs, whose lags the reports record
    changelog_uri: str


@dataclass(frozen=True)
class RunPlan:
    """What a run over `keys` takes from the pipeline config, resolved once before it
    starts (`plan_run`)."""

    kafka_conf: dict
    group: str
    keys: list[str]
    topic_partitions: dict[str, tuple[str, int]]  # each key's topic and partition
    # A partition of no configured source has the KeyError instead: it fails on its own.
    partitions: dict[str, PartitionPlan | KeyError]
    # The distinct registries the partitions' sources name, opened once for the run.
    registries: list[HandlerRegistry]
    workers: WorkerRule
    report: RunReport

    def partition(self, key: str) -> PartitionPlan:
        plan = self.partitions[key]
        if isinstance(plan, KeyError):
            raise plan
        return plan


def plan_run(pipeline: PipelineConfig, kafka_conf: dict, keys: Sequence[str],
             run_config: RunLimits, *, group: str,
             writer: ChangelogWriter | None = None) -> RunPlan:
    """The plan of a run over `keys`, its partitions sharing one changelog writer."""
    workers = worker_rule(pipeline, run_config)
    writer = writer or ChangelogWriter(pipeline)
    changelog = changelog_uri(pipeline)
    topic_partitions = {key: parse_partition_key(key) for key in keys}
    partitions: dict[str, PartitionPlan | KeyError] = {}
    for key, (topic, partition) in topic_partitions.items():
        try:
            source = pipeline.source_for_topic(topic)
        except KeyError as exc:
            partitions[key] = exc
            continue
        settings = RunSettings(
            kafka_conf=kafka_conf,
            group_id=group,
            format=source.format,
            ordering=source.ordering,
            table_ordering={t.source: t.ordering for t in source.tables if t.ordering},
            lanes=source.lanes,
            workers=source.workers,
            key_slots_per_lane=source.key_slots_per_lane,
            max_in_flight=source.max_in_flight,
            error_policy=ErrorPolicy(max_retries=source.max_retries, strict=source.strict),
            handler_timeout_seconds=source.handler_timeout_seconds,
            source=source.name,
            dead_letter_topic=source.dlq_topic,
            max_records=run_config.max_records or pipeline.dagster.max_records_per_run,
            max_seconds=run_config.max_seconds or pipeline.dagster.max_seconds_per_run,
            commit_timeout_seconds=pipeline.dagster.commit_timeout_seconds,
            start_offset=run_config.start_offset,
            key_columns={t.source: list(t.key_columns) for t in source.tables
                         if t.key_columns} or None,
            schema_registry=dict(pipeline.schema_registry) or None,
        )
        partitions[key] = PartitionPlan(key, topic, partition, settings,
                                        run_config.start_timestamp_ms, source.handlers,
                                        writer, pipeline.lakehouse.uri(), tuple(source.topics))
    topics = {topic for topic, _ in topic_partitions.values()}
    sources = [s for s in pipeline.sources if any(map(s.matches, topics))]
    found = (s.handler_registry() for s in sources)
    registries = list({id(r): r for r in found}.values())
    report = RunReport(kafka_conf, group, sources,
                       list(dict.fromkeys(t for s in sources for t in s.topics)), changelog)
    return RunPlan(kafka_conf, group, list(keys), topic_partitions, partitions, registries,
                   workers, report)


def consume_partition(
    pipeline: PipelineConfig,
    kafka_conf: dict,
    key: str,
    run_config: RunLimits,
    handlers: HandlerRegistry | None = None,
    *,
    group: str,
    metadata_checkpoint: Callable[[], Checkpoint | None] = lambda: None,
    writer: ChangelogWriter | None = None,
    stop: Stop | None = None,
) -> tuple[RunSummary, FencedChangelogSink]:
    """One bounded consumer run of `key` into the changelog: what the asset does for each
    of its partitions, without Dagster around it. `handlers` defaults to the registry
    the partition's source names in the config."""
    plan = plan_run(pipeline, kafka_conf, [key], run_config, group=group, writer=writer)
    return run_partition(plan.partition(key), handlers,
                         metadata_checkpoint=metadata_checkpoint, stop=stop)



def consume_partitions(
    pipeline: PipelineConfig,
    kafka_conf: dict,
    keys: Sequence[str],
    run_config: RunLimits,
    handlers: HandlerRegistry | None = None,
    *,
    group: str,
    metadata_checkpoint: Callable[[str], Checkpoint | None] = lambda key: None,
    parallel: int = PARTITIONS_IN_PARALLEL,
    on_interrupt: Callable[[list[PartitionOutcome]], None] = lambda outcomes: None,
    lags: Mapping[str, int] | None = None,
) -> list[PartitionOutcome]:
    """Bounded runs of every partition in `keys`: `run_partitions` of their plan."""
    return run_partitions(plan_run(pipeline, kafka_conf, keys, run_config, group=group),
                          handlers, metadata_checkpoint=metadata_checkpoint,
                          parallel=parallel, on_interrupt=on_interrupt, lags=lags)


def run_partitions(
    plan: RunPlan,
    handlers: HandlerRegistry | None = None,
    *,
    metadata_checkpoint: Callable[[str], Checkpoint | None] = lambda key: None,
    parallel: int = PARTITIONS_IN_PARALLEL,
    on_interrupt: Callable[[list[PartitionOutcome]], None] = lambda outcomes: None,
    lags: Mapping[str, int] | None = None,
    together: bool = False,
) -> list[PartitionOutcome]:
    """Bounded runs of every partition of `plan`, `parallel` at a time, sharing one
    changelog writer and the handlers' clients (opened once for the run). A partition
    that fails does not stop the others: its outcome carries the error. `lags`: each
    partition's lag as the caller has just measured it, for the worker processes'
    backlog rule (`WorkerRule.processes`), which otherwise measures it. `together`: the
    partitions run in this process start from checkpoints read once for all and make
    their last commit points together (`RoundCommit`).

    Interrupted while it waits (Dagster terminates a run with SIGINT, raised here as
    `DagsterExecutionInterruptedError`), it starts no more partitions, stops those
    running at their next batch (each commits what its handlers finished), hands their
    outcomes to `on_interrupt`, and raises the interrupt again."""
    keys = plan.keys
    # The threads start once the cluster is checked and the workers counted.
    # Refused credentials fail the run at once, named, instead of empty polls until the end.
    check_cluster(plan.kafka_conf)
    threads = max(1, min(parallel, len(keys)))
    # Handlers given by the caller are objects of this process: only the config's
    # registries can be opened in another.
    workers = (plan.workers.processes(plan.kafka_conf, plan.group, plan.topic_partitions, lags)
               if handlers is None and len(keys) > 1 else 0)
    stop = worker_stop() if workers else threading.Event()

    with ExitStack() as opened:
        round_ = _round(plan, opened) if together else None
        if isinstance(round_, Exception):  # no partition can start without its checkpoints
            return [PartitionOutcome(key, error=round_) for key in keys]
        for registry in [handlers] if handlers is not None else plan.registries:
            opened.enter_context(registry.opened())
        queue = _Partitions(plan, handlers, metadata_checkpoint, stop, round_)
        done = queue.done
        # Partitions run in threads even when there is one: the interrupt is raised in
        # this thread, which then asks them to stop instead of abandoning a commit.
        pool = opened.enter_context(ThreadPoolExecutor(
            max_workers=threads + workers, thread_name_prefix="binlake-partition"))
        futures = [pool.submit(queue.run_here) for _ in range(threads)]
        if workers:
            processes = opened.enter_context(worker_pool(workers, stop))
            futures += [pool.submit(queue.run_there, processes) for _ in range(workers)]
        try:
            for future in futures:
                future.result()
        except BaseException:
            stop.set()
            wait(futures)
            _commit_round(round_, done)
            on_interrupt([done[key] for key in keys if key in done])
            raise
        _commit_round(round_, done)
        return [done[key] for key in keys]


class _Partitions:
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


def _round(plan: RunPlan, opened: ExitStack) -> RoundCommit | Exception | None:
    """The run's `RoundCommit`, its checkpoints read, closed with `opened`; the error
    that kept it from reading them; None when no partition has a source to run."""
    plans = [p for p in plan.partitions.values() if isinstance(p, PartitionPlan)]
    if not plans:
        return None
    first = plans[0]
    round_ = RoundCommit(plan.kafka_conf, plan.group, first.writer,
                         first.settings.commit_timeout_seconds)
    opened.callback(round_.close)
    try:
        round_.read_checkpoints([(p.topic, p.partition) for p in plans])
    except Exception as exc:
        return exc
    return round_


def _commit_round(round_: RoundCommit | None, done: dict[str, PartitionOutcome]) -> None:
    """The held commit points of the partitions that ran to their end, made together;
    each outcome then says what its partition committed, or the error that stopped it."""
    if round_ is None:
        return
    ended = [key for key, o in done.items() if o.error is None and o.summary is not None]
    for key, result in round_.commit(ended).items():
        if isinstance(result, BaseException):
            done[key] = PartitionOutcome(key, error=result)
        else:
            summary = done[key].summary
            summary.committed_offset = result
            summary.kafka_wait_seconds = max(summary.kafka_wait_seconds,
                                             round_.kafka_wait_seconds)
