"""The changelog asset: bounded consumer runs of Kafka topic-partitions, with no JVM.

Materializing partition `topic:partition` reads that partition from its checkpoint to
the end offset seen at the start, applies the configured handlers in lanes, and writes
every event to the changelog Delta table (delta-rs) in one idempotent commit per commit
point, before the Kafka commit. One Dagster run serves a range of partitions (the lag
sensor's batches, a backfill's `max_partitions_per_run`): each partition is its own
bounded run with its own checkpoint, tracker, fence and metadata, several at a time in
the run's process. Its metadata (offsets, counts, lag, throughput, Delta version) is
what the UI charts, and the committed offset in it is itself a checkpoint source.

A run is fenced (invariant 4): before each changelog write it checks that the
changelog's transaction state for this partition is still where this run left it; if
another run moved it, this one writes nothing more and fails with a clear message.
Check and write happen under a file lock per partition when the lakehouse is a local
path, so no other process can commit in between (delta-rs does not refuse a transaction
version it already holds, delta-rs #2580: the writer reads it again under the lock). On
object storage there is no such lock: the lag sensor's one-owner rule and Dagster's
one-run-per-partition limit (dagster.yaml) are the lines there.
"""

import fcntl
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from pydantic import Field

from binlog_assets.config import PipelineConfig
from binlog_assets.consume.checkpoint import CHANGELOG, Checkpoint
from binlog_assets.consume.errors import ErrorPolicy
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.lag import measure_lag
from binlog_assets.consume.run import BoundedRun, RunSettings, RunSummary
from binlog_assets.formats.event import ChangeEvent
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.orchestration.metadata_checkpoint import latest_metadata_checkpoint
from binlog_assets.orchestration.partitions import (
    CHANGELOG_ASSET_KEY,
    kafka_partitions_def,
    parse_partition_key,
    partition_key,
)
from binlog_assets.orchestration.resources import BinlakeResource

# Partitions of one run consumed at the same time, each by its own consumer and lanes:
# their fixed costs (round trips to the coordinator and the leader, the Delta commits)
# overlap, while decoding shares the one interpreter anyway.
PARTITIONS_IN_PARALLEL = 4



class FencedRunError(RuntimeError):
    """Another run moved this partition's checkpoint: this run must not write."""


class ChangelogRunConfig(dg.Config):
    """Run config of one bounded consumer run (set it in the launchpad to replay)."""

    start_offset: int | None = Field(
        None, description="replay from this offset (overrides every checkpoint source)")
    start_timestamp_ms: int | None = Field(
        None, description="replay from the first offset at or after this time (ms)")
    max_records: int | None = Field(None, description="stop after this many records")
    max_seconds: float | None = Field(None, description="stop after this many seconds")


def offset_for_timestamp(kafka_conf: dict, topic: str, partition: int, ts_ms: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**kafka_conf, "group.id": "binlake-offsets-for-times"})
    try:
        found = consumer.offsets_for_times([TopicPartition(topic, partition, ts_ms)],
                                           timeout=30)[0]
        if found.offset >= 0:
            return found.offset
        return consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                              timeout=30, cached=False)[1]
    finally:
        consumer.close()


@contextmanager
def partition_lock(lakehouse: str, group: str, topic: str, partition: int) -> Iterator[None]:
    """An exclusive lock across processes for one partition's changelog writes (local
    lakehouse paths only; a no-op for object storage)."""
    if "://" in lakehouse:
        yield
        return
    locks = Path(lakehouse) / "_binlake_locks"
    locks.mkdir(parents=True, exist_ok=True)
    # Topic names are [A-Za-z0-9._-]; the group is sanitized the same way.
    safe_group = "".join(c if c.isalnum() or c in "._-" else "_" for c in group)
    with open(locks / f"{safe_group}__{topic}__{partition}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class FencedChangelogSink:
    """Writes each contiguous range to the changelog, after checking nobody else did."""

    def __init__(self, writer, checkpoint_of, *, group: str, topic: str, partition: int,
                 expected: int | None, lakehouse: str) -> None:
        self.writer = writer
        self.lakehouse = lakehouse
        self.checkpoint_of = checkpoint_of
        self.group, self.topic, self.partition = group, topic, partition
        self.expected = expected
        self.version: int | None = None
        self.rows = 0

    def __call__(self, events: list[ChangeEvent], raw: dict[int, bytes],
                 end_offset: int) -> None:
        if self.expected is not None and end_offset <= self.expected:
            return  # a replay below the changelog's checkpoint: those rows are there already
        if self.expected is not None:
            events = [e for e in events if e.offset >= self.expected]
        with partition_lock(self.lakehouse, self.group, self.topic, self.partition):
            current = self.checkpoint_of()
            if current != self.expected:
                raise FencedRunError(
                    f"{self.topic}[{self.partition}] was overtaken: its changelog checkpoint "
                    f"is {current}, this run expected {self.expected}; it writes nothing more")
            version = self.writer.write(events, raw, group_id=self.group, topic=self.topic,
                                        partition=self.partition, end_offset=end_offset)
        if version is None:
            raise FencedRunError(
                f"{self.topic}[{self.partition}]: another run wrote up to {end_offset} first")
        self.version = version
        self.rows += len(events)
        self.expected = end_offset


def summary_metadata(summary: RunSummary, lag_at_end: int | None,
                     version: int | None) -> dict[str, dg.MetadataValue]:
    md: dict[str, dg.MetadataValue] = {
        "topic": dg.MetadataValue.text(summary.topic),
        "partition": dg.MetadataValue.int(summary.partition),
        "start_offset": dg.MetadataValue.int(summary.start_offset),
        "checkpoint_source": dg.MetadataValue.text(summary.checkpoint_source),
        "committed_offset": dg.MetadataValue.int(summary.committed_offset),
        "end_offset_at_start": dg.MetadataValue.int(summary.end_offset),
        "records": dg.MetadataValue.int(summary.records),
        "events": dg.MetadataValue.int(summary.events),
        "dead_lettered": dg.MetadataValue.int(summary.dead_lettered),
        "skipped_already_done": dg.MetadataValue.int(summary.skipped_already_done),
        "throughput_records_per_s": dg.MetadataValue.float(round(summary.throughput, 1)),
        "seconds": dg.MetadataValue.float(round(summary.seconds, 3)),
        "stop_reason": dg.MetadataValue.text(summary.stop_reason),
        "per_table": dg.MetadataValue.json(summary.per_table()),
        "per_op": dg.MetadataValue.json(summary.per_op()),
    }
    for op, n in summary.per_op().items():
        md[f"events_{op}"] = dg.MetadataValue.int(n)
    for name, m in summary.handlers.items():
        # One number per key, so the UI plots each handler's series over runs.
        for field in ("events", "errors", "retries", "dead_lettered", "timeouts"):
            md[f"handler.{name}.{field}"] = dg.MetadataValue.int(getattr(m, field))
        md[f"handler.{name}.p50_ms"] = dg.MetadataValue.float(m.p50_ms)
        md[f"handler.{name}.p99_ms"] = dg.MetadataValue.float(m.p99_ms)
    if lag_at_end is not None:
        md["lag_at_end"] = dg.MetadataValue.int(lag_at_end)
    if version is not None:
        md["changelog_version"] = dg.MetadataValue.int(version)
    return md


def consume_partition(
    cfg: PipelineConfig,
    kafka_conf: dict,
    key: str,
    run_config: ChangelogRunConfig,
    handlers: HandlerRegistry | None = None,
    *,
    group: str,
    metadata_checkpoint: Callable[[], Checkpoint | None] = lambda: None,
    writer: ChangelogWriter | None = None,
) -> tuple[RunSummary, FencedChangelogSink]:
    """One bounded consumer run of `key` into the changelog: what the asset does for each
    of its partitions, without Dagster around it. `handlers` defaults to the registry
    the partition's source names in the config."""
    topic, partition = parse_partition_key(key)
    source = cfg.source_for_topic(topic)
    if handlers is None:
        handlers = source.handler_registry()
    writer = writer or ChangelogWriter(cfg)

    def changelog_cp() -> int | None:
        return writer.checkpoint(group, topic, partition)

    start = run_config.start_offset
    if start is None and run_config.start_timestamp_ms is not None:
        start = offset_for_timestamp(kafka_conf, topic, partition,
                                     run_config.start_timestamp_ms)
    initial = changelog_cp()
    sink = FencedChangelogSink(writer, changelog_cp, group=group,
                               topic=topic, partition=partition, expected=initial,
                               lakehouse=cfg.lakehouse.uri())
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
        dead_letter_topic=source.dlq_topic,
        max_records=run_config.max_records or cfg.dagster.max_records_per_run,
        max_seconds=run_config.max_seconds or cfg.dagster.max_seconds_per_run,
        start_offset=start,
        extra_checkpoint_sources=(
            lambda: None if initial is None else Checkpoint(initial, CHANGELOG),
            metadata_checkpoint,
        ),
        key_columns={t.source: list(t.key_columns) for t in source.tables if t.key_columns}
        or None,
    )
    with handlers.opened():
        summary = BoundedRun(topic, partition, handlers, settings, sink=sink).run()
    return summary, sink


@dataclass
class PartitionOutcome:
    """One partition of a run: its summary and sink, or the error that stopped it."""

    key: str
    summary: RunSummary | None = None
    sink: FencedChangelogSink | None = None
    error: BaseException | None = None


def consume_partitions(
    cfg: PipelineConfig,
    kafka_conf: dict,
    keys: Sequence[str],
    run_config: ChangelogRunConfig,
    handlers: HandlerRegistry | None = None,
    *,
    group: str,
    metadata_checkpoint: Callable[[str], Checkpoint | None] = lambda key: None,
    parallel: int = PARTITIONS_IN_PARALLEL,
) -> list[PartitionOutcome]:
    """Bounded runs of every partition in `keys`, `parallel` at a time, sharing one
    changelog writer and the handlers' clients (opened once for the run). A partition
    that fails does not stop the others: its outcome carries the error."""
    writer = ChangelogWriter(cfg)

    def one(key: str) -> PartitionOutcome:
        try:
            summary, sink = consume_partition(
                cfg, kafka_conf, key, run_config, handlers, group=group,
                metadata_checkpoint=lambda: metadata_checkpoint(key), writer=writer)
            return PartitionOutcome(key, summary, sink)
        except Exception as exc:  # reported per partition by the caller
            return PartitionOutcome(key, error=exc)

    with ExitStack() as opened:
        for registry in _registries(cfg, keys, handlers):
            opened.enter_context(registry.opened())
        if len(keys) == 1:
            return [one(keys[0])]
        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(keys))),
                                thread_name_prefix="binlake-partition") as pool:
            return list(pool.map(one, keys))


def _registries(cfg: PipelineConfig, keys: Sequence[str],
                handlers: HandlerRegistry | None) -> list[HandlerRegistry]:
    """The distinct registries the partitions' sources name (or just `handlers`). A
    partition of no configured source fails on its own, in `consume_partition`."""
    if handlers is not None:
        return [handlers]
    topics = {parse_partition_key(k)[0] for k in keys}
    found = (s.handler_registry() for s in cfg.sources if topics.intersection(s.topics))
    return list({id(r): r for r in found}.values())


def _lags(kafka_conf: dict, group: str, keys: Sequence[str]) -> dict[str, int]:
    topics = sorted({parse_partition_key(k)[0] for k in keys})
    return {partition_key(pl.topic, pl.partition): pl.lag
            for pl in measure_lag(kafka_conf, group, topics)}


@dg.asset(
    key=CHANGELOG_ASSET_KEY,
    partitions_def=kafka_partitions_def,
    group_name="binlake",
    kinds={"kafka", "delta"},
)
def changelog(
    context: dg.AssetExecutionContext,
    config: ChangelogRunConfig,
    binlake: BinlakeResource,
) -> dg.MaterializeResult:
    """Bronze changelog: every change event of a Kafka topic-partition, appended to the
    `changelog` Delta table exactly once (transaction id per group and partition), by a
    bounded consumer run from the partition's checkpoint to the end offset at its start.
    One run serves one partition or a range of them; each gets its own metadata."""
    keys = list(context.partition_keys)
    group = binlake.group_id()
    kafka_conf = binlake.kafka_conf()
    outcomes = consume_partitions(
        binlake.pipeline, kafka_conf, keys, config, group=group,
        metadata_checkpoint=lambda key: latest_metadata_checkpoint(context.instance, key),
    )
    lags = _lags(kafka_conf, group, keys)
    failed = [o for o in outcomes if o.error is not None]
    for outcome in outcomes:
        if outcome.error is not None:
            context.log.error(f"{outcome.key}: {type(outcome.error).__name__}: "
                              f"{outcome.error}")
            continue
        summary, key = outcome.summary, outcome.key
        context.log.info(
            f"{key}: {summary.records} records from {summary.start_offset} "
            f"({summary.checkpoint_source}) to {summary.committed_offset} in "
            f"{summary.seconds:.1f}s; {summary.dead_lettered} dead-lettered")
        disagree = [f"{c.source}={c.offset}" for c in summary.checkpoint_candidates
                    if c.offset != summary.start_offset]
        if disagree:
            context.log.warning(f"{key}: checkpoint sources disagree with the chosen "
                                f"{summary.checkpoint_source}={summary.start_offset}: "
                                f"{disagree}")
        metadata = summary_metadata(summary, lags.get(key), outcome.sink.version)
        if failed:
            # The run fails below, so its output records nothing: what did finish is
            # recorded here, so its committed offsets still show (and still count).
            context.log_event(dg.AssetMaterialization(
                asset_key=CHANGELOG_ASSET_KEY, partition=key, metadata=metadata))
        else:
            context.add_asset_metadata(metadata, partition_key=key)
    if failed:
        first = failed[0].error
        raise RuntimeError(
            f"{len(failed)} of {len(outcomes)} partitions failed: "
            + "; ".join(f"{o.key}: {o.error}" for o in failed)) from first
    return dg.MaterializeResult()
