"""What the changelog asset runs for its partitions, without Dagster around it: one
bounded consumer run per topic-partition (`consume_partition`), several at a time in one
process (`consume_partitions`; a large backlog also in worker processes,
`consume_workers.py`), each writing the changelog through its fence, with the handlers
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
from dataclasses import dataclass, replace

import dagster as dg
from pydantic import Field

from binlog_assets.config import PipelineConfig, SourceConfig
from binlog_assets.consume.backlog import WorkerRule
from binlog_assets.consume.checkpoint import CHANGELOG, Checkpoint, offset_for_timestamp
from binlog_assets.consume.errors import ErrorPolicy
from binlog_assets.consume.handlers import HandlerRegistry, load_registry
from binlog_assets.consume.lag import high_watermark, topic_named
from binlog_assets.consume.lineage import Placer
from binlog_assets.consume.preflight import check_cluster
from binlog_assets.consume.run import BoundedRun, RunSettings, RunSummary, Stop
from binlog_assets.formats.event import Position
from binlog_assets.lakehouse.changelog import (
    ChangelogWriter,
    changelog_uri,
)
from binlog_assets.lakehouse.fence import FencedChangelogSink
from binlog_assets.orchestration.consume_workers import (
    SinkTotals,
    consume_in_worker,
    worker_pool,
    worker_rule,
    worker_stop,
)
from binlog_assets.orchestration.partitions import parse_partition_key
from binlog_assets.orchestration.round_commit import RoundCommit

# Partitions of one run consumed at the same time, each by its own consumer and lanes:
# their fixed costs (round trips to the coordinator and the leader, the Delta commits)
# overlap, while decoding shares the one interpreter anyway.
PARTITIONS_IN_PARALLEL = 4


class ChangelogRunConfig(dg.Config):
    """Replay and limits of one bounded consumer run, set in the launchpad. A replay reads
    the partition again from the given point: the handlers see those events again, and
    the changelog stays exactly once (rows it already holds are not appended again)."""

    start_offset: int | None = Field(
        None, description="Replay from this Kafka offset. Overrides every checkpoint "
                          "source, and wins over start_timestamp_ms when both are set.")
    start_timestamp_ms: int | None = Field(
        None, description="Replay from the first offset at or after this time (ms since "
                          "the epoch, the broker's record timestamps). Ignored when "
                          "start_offset is set.")
    max_records: int | None = Field(
        None, description="Stop after this many records (default: "
                          "dagster.max_records_per_run; the next run goes on from there).")
    max_seconds: float | None = Field(
        None, description="Stop after this many seconds (default: "
                          "dagster.max_seconds_per_run).")


# What the launchpad opens on: the replay fields, in this order, and no infrastructure
# settings (the binlake resource reads its config file from BINLAKE_CONFIG).
CHANGELOG_RUN_CONFIG_SCAFFOLD = {
    "ops": {"changelog": {"config": dict.fromkeys(ChangelogRunConfig.model_fields)}}}


@dataclass(frozen=True)
class PartitionPlan:
    """What one partition's bounded run takes from the pipeline config, resolved before
    it starts; it pickles, so a worker process is handed it as it is."""

    key: str
    topic: str
    partition: int
    settings: RunSettings  # its source's, with the run's limits; the start comes at run time
    start_timestamp_ms: int | None
    handlers: str | None  # the source's registry by name: imported where the run runs
    writer: ChangelogWriter
    lakehouse: str  # where the fence takes the partition's lock
    source_topics: tuple[str, ...] = ()  # its source's topics (names, or `^` patterns)


def consume_partition(
    pipeline: PipelineConfig,
    kafka_conf: dict,
    key: str,
    run_config: ChangelogRunConfig,
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


def run_partition(
    plan: PartitionPlan,
    handlers: HandlerRegistry | None = None,
    *,
    metadata_checkpoint: Callable[[], Checkpoint | None] = lambda: None,
    stop: Stop | None = None,
    together: RoundCommit | None = None,
) -> tuple[RunSummary, FencedChangelogSink]:
    """`consume_partition` by its plan. `handlers` defaults to the source's registry.
    `together`: the round whose checkpoints it starts from and which makes its last
    commit point with the other partitions' (`round_commit.py`)."""
    topic, partition, group = plan.topic, plan.partition, plan.settings.group_id
    initial = (together.changelog[(topic, partition)] if together is not None
               else plan.writer.checkpoint(group, topic, partition))
    sink = FencedChangelogSink(plan.writer, group=group,
                               topic=topic, partition=partition, expected=initial,
                               lakehouse=plan.lakehouse)
    if handlers is None:
        handlers = load_registry(plan.handlers)
    start = plan.settings.start_offset
    if start is None and plan.start_timestamp_ms is not None:
        start = offset_for_timestamp(plan.settings.kafka_conf, topic, partition,
                                     plan.start_timestamp_ms)
    settings = replace(
        plan.settings,
        start_offset=start,
        extra_checkpoint_sources=(
            lambda: None if initial is None else Checkpoint(initial, CHANGELOG),
            metadata_checkpoint,
        ),
        kafka_checkpoint=None if together is None else (
            lambda: together.kafka_checkpoint(topic, partition)),
    )
    hold = None if together is None else together.hold(plan.key, plan.settings.source, sink)
    with handlers.opened():
        summary = BoundedRun(topic, partition, handlers, settings, sink=sink,
                             stop=stop, hold=hold, placer=placer(plan, initial),
                             covered=SnapshotSchema(plan)).run()
    return summary, sink


def placer(plan: PartitionPlan, checkpoint: int | None) -> Placer:
    """The partition's lineage placer: its source's lineages and its tail, as the
    changelog holds them (up to its `checkpoint`: a replay of offsets below it places
    them anew, without moving the tail)."""
    writer, topic, partition = plan.writer, plan.topic, plan.partition
    tail = writer.tail(plan.settings.group_id, topic, partition)
    return Placer(writer.book(plan.settings.source), f"{topic}[{partition}]", tail,
                  lambda: None if tail is None else writer.tail_origin(topic, partition, tail),
                  replayed_below=checkpoint)


@dataclass(frozen=True)
class SnapshotSchema:
    """The tables a snapshot that ended in this partition read (`snapshot_end.py`): those
    its schema-change topic replayed into the changelog; None while that topic, which the
    partition's source consumes, has records the changelog does not hold yet."""

    plan: PartitionPlan

    def __call__(self, position: Position, schema_topic: str) -> list[str] | None:
        plan = self.plan
        if not schema_topic or not any(topic_named(schema_topic, t)
                                       for t in plan.source_topics):
            return []
        tables = plan.writer.snapshot_tables(position)
        if tables:
            return tables
        done = plan.writer.checkpoint(plan.settings.group_id, schema_topic, 0) or 0
        return None if done < high_watermark(plan.settings.kafka_conf, schema_topic, 0) else []


@dataclass
class PartitionOutcome:
    """One partition of a run: its summary and sink, or the error that stopped it."""

    key: str
    summary: RunSummary | None = None
    sink: FencedChangelogSink | SinkTotals | None = None  # totals: from a worker process
    error: BaseException | None = None


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
             run_config: ChangelogRunConfig, *, group: str,
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


def consume_partitions(
    pipeline: PipelineConfig,
    kafka_conf: dict,
    keys: Sequence[str],
    run_config: ChangelogRunConfig,
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
    todo = iter(keys)
    taking = threading.Lock()
    done: dict[str, PartitionOutcome] = {}

    def take() -> str | None:
        with taking:
            return None if stop.is_set() else next(todo, None)

    def here() -> None:
        while (key := take()) is not None:
            partition = plan.partitions[key]
            try:
                if isinstance(partition, KeyError):
                    raise partition
                summary, sink = run_partition(
                    partition, handlers,
                    metadata_checkpoint=lambda key=key: metadata_checkpoint(key), stop=stop,
                    together=round_)
                done[key] = PartitionOutcome(key, summary, sink)
            except Exception as exc:  # reported per partition by the caller
                done[key] = PartitionOutcome(key, error=exc)

    def there(processes: ProcessPoolExecutor) -> None:
        while (key := take()) is not None:
            partition = plan.partitions[key]
            if isinstance(partition, KeyError):  # no source: fails here as it would there
                done[key] = PartitionOutcome(key, error=partition)
                continue
            try:
                done[key] = processes.submit(
                    consume_in_worker, partition, metadata_checkpoint(key)).result()
            except Exception as exc:  # a worker died (BrokenProcessPool) or the like
                done[key] = PartitionOutcome(key, error=exc)
                return  # the pool is broken: the run's threads take the rest

    # The threads above start once the cluster is checked and the workers counted.
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
        # Partitions run in threads even when there is one: the interrupt is raised in
        # this thread, which then asks them to stop instead of abandoning a commit.
        pool = opened.enter_context(ThreadPoolExecutor(
            max_workers=threads + workers, thread_name_prefix="binlake-partition"))
        futures = [pool.submit(here) for _ in range(threads)]
        if workers:
            processes = opened.enter_context(worker_pool(workers, stop))
            futures += [pool.submit(there, processes) for _ in range(workers)]
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
