"""One partition's bounded consumer run into the changelog, without Dagster around it:
its plan (`PartitionPlan`, what it takes from the pipeline config, resolved before it
starts; it pickles, so a worker process is handed it as it is), the run itself
(`run_partition`) and its outcome."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from binlog_assets.consume.checkpoint import CHANGELOG, Checkpoint, offset_for_timestamp
from binlog_assets.consume.handlers import HandlerRegistry, load_registry
from binlog_assets.consume.lag import high_watermark, topic_named
from binlog_assets.consume.lineage import Placer
from binlog_assets.consume.run import BoundedRun, RunSummary
from binlog_assets.consume.run_settings import RunParts, RunSettings, StopSignal
from binlog_assets.formats.event import Position
from binlog_assets.lakehouse.changelog import (
    ChangelogWriter,
)
from binlog_assets.lakehouse.fence import FencedChangelogSink

if TYPE_CHECKING:
    from binlog_assets.rounds.round_commit import RoundCommit


class RunLimits(Protocol):
    """Replay and limits of one bounded consumer run (the launchpad's
    `ChangelogRunConfig`, or any object with these four attributes)."""

    start_offset: int | None
    start_timestamp_ms: int | None
    max_records: int | None
    max_seconds: float | None


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


def run_partition(
    plan: PartitionPlan,
    handlers: HandlerRegistry | None = None,
    *,
    metadata_checkpoint: Callable[[], Checkpoint | None] = lambda: None,
    stop: StopSignal | None = None,
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
        parts = RunParts(sink=sink, stop=stop, hold=hold, placer=placer(plan, initial),
                         covered=SnapshotSchema(plan))
        summary = BoundedRun(topic, partition, handlers, settings, parts).run()
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


@dataclass(frozen=True)
class SinkTotals:
    """What a worker's changelog sink reports back: rows appended, the last version."""

    rows: int
    version: int | None


@dataclass
class PartitionOutcome:
    """One partition of a run: its summary and sink, or the error that stopped it."""

    key: str
    summary: RunSummary | None = None
    sink: FencedChangelogSink | SinkTotals | None = None  # totals: from a worker process
    error: BaseException | None = None


