"""The changelog asset: one bounded consumer run per Kafka topic-partition.

Materializing partition `topic:partition` reads that partition from its checkpoint to
the end offset seen at the start, applies the configured handlers in lanes, and writes
every event to the changelog Delta table in one idempotent commit per commit point,
before the Kafka commit. Its metadata (offsets, counts, lag, throughput, Delta version)
is what the UI charts, and the committed offset in it is itself a checkpoint source.

A run is fenced (invariant 4): before each changelog write it checks that the
changelog's transaction state for this partition is still where this run left it; if
another run moved it, this one writes nothing more and fails with a clear message.
Check and write happen under a file lock per partition when the lakehouse is a local
path, so no other process can commit in between; Delta's own conflict detection fails a
concurrent commit for the same transaction id. On object storage there is no such lock:
Dagster's one-run-per-partition limit (dagster.yaml) is the first line there.
"""

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from binlog_assets.config import PipelineConfig
from binlog_assets.consume.checkpoint import CHANGELOG, METADATA, Checkpoint
from binlog_assets.consume.errors import ErrorPolicy
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.lag import measure_lag
from binlog_assets.consume.run import BoundedRun, RunSettings, RunSummary
from binlog_assets.formats.event import ChangeEvent
from binlog_assets.orchestration.partitions import kafka_partitions_def, parse_partition_key
from binlog_assets.orchestration.resources import SPARK_POOL, BinlakeResource, load_handlers
from binlog_assets.orchestration.sensors import group_id

CHANGELOG_ASSET_KEY = dg.AssetKey("changelog")


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


def latest_metadata_checkpoint(instance: dg.DagsterInstance, key: str) -> Checkpoint | None:
    """The committed offset recorded by this partition's latest materialization."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=CHANGELOG_ASSET_KEY, asset_partitions=[key]), limit=1
    ).records
    if not records:
        return None
    mat = records[0].asset_materialization
    value = mat.metadata.get("committed_offset") if mat else None
    return None if value is None else Checkpoint(int(value.value), METADATA)


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
    if lag_at_end is not None:
        md["lag_at_end"] = dg.MetadataValue.int(lag_at_end)
    if version is not None:
        md["changelog_version"] = dg.MetadataValue.int(version)
    return md


def consume_partition(
    cfg: PipelineConfig,
    kafka_conf: dict,
    spark,
    key: str,
    run_config: ChangelogRunConfig,
    handlers: HandlerRegistry,
    *,
    group: str,
    metadata_checkpoint: Callable[[], Checkpoint | None] = lambda: None,
) -> tuple[RunSummary, FencedChangelogSink]:
    """One bounded consumer run of `key` into the changelog: what the asset does, without
    Dagster around it."""
    from binlog_assets.lakehouse.changelog import ChangelogWriter, changelog_checkpoint

    topic, partition = parse_partition_key(key)
    source = cfg.source_for_topic(topic)

    def changelog_cp() -> int | None:
        return changelog_checkpoint(spark, cfg, group, topic, partition)

    start = run_config.start_offset
    if start is None and run_config.start_timestamp_ms is not None:
        start = offset_for_timestamp(kafka_conf, topic, partition,
                                     run_config.start_timestamp_ms)
    initial = changelog_cp()
    sink = FencedChangelogSink(ChangelogWriter(spark, cfg), changelog_cp, group=group,
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
    summary = BoundedRun(topic, partition, handlers, settings, sink=sink).run()
    return summary, sink


@dg.asset(
    key=CHANGELOG_ASSET_KEY,
    partitions_def=kafka_partitions_def,
    group_name="binlake",
    kinds={"kafka", "spark", "delta"},
    pool=SPARK_POOL,
)
def changelog(
    context: dg.AssetExecutionContext,
    config: ChangelogRunConfig,
    binlake: BinlakeResource,
    pyspark: LazyPySparkResource,
) -> dg.MaterializeResult:
    """Bronze changelog: every change event of one Kafka topic-partition, appended to the
    `changelog` Delta table exactly once (transaction id per group and partition), by a
    bounded consumer run from the partition's checkpoint to the end offset at its start."""
    key = context.partition_key
    topic, partition = parse_partition_key(key)
    group = group_id(binlake)
    kafka_conf = binlake.kafka_conf()
    summary, sink = consume_partition(
        binlake.pipeline, kafka_conf, binlake.spark(pyspark), key, config,
        load_handlers(binlake.handlers), group=group,
        metadata_checkpoint=lambda: latest_metadata_checkpoint(context.instance, key),
    )
    lag = next((pl.lag for pl in measure_lag(kafka_conf, group, [topic])
                if pl.partition == partition), None)
    context.log.info(
        f"{key}: {summary.records} records from {summary.start_offset} "
        f"({summary.checkpoint_source}) to {summary.committed_offset} in "
        f"{summary.seconds:.1f}s; {summary.dead_lettered} dead-lettered")
    disagree = [f"{c.source}={c.offset}" for c in summary.checkpoint_candidates
                if c.offset != summary.start_offset]
    if disagree:
        context.log.warning(f"{key}: checkpoint sources disagree with the chosen "
                            f"{summary.checkpoint_source}={summary.start_offset}: {disagree}")
    return dg.MaterializeResult(metadata=summary_metadata(summary, lag, sink.version))
