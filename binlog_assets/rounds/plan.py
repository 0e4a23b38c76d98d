"""A consume round's plan: what a run over some topic-partitions takes from the pipeline
config, resolved once before it starts (`plan_run`). The partitions' runs are handed
their plans, not the config, and the run's report what it needs (`RunReport`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from binlog_assets.config import PipelineConfig, SourceConfig
from binlog_assets.consume.backlog import WorkerRule
from binlog_assets.consume.errors import ErrorPolicy
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.run import RunSettings
from binlog_assets.lakehouse.changelog import (
    ChangelogWriter,
    changelog_uri,
)
from binlog_assets.rounds.keys import parse_partition_key
from binlog_assets.rounds.partition import PartitionPlan, RunLimits
from binlog_assets.rounds.workers import worker_rule


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

    def planned(self) -> list[PartitionPlan]:
        """The plans of the partitions that have a source, in the order of `keys`."""
        return [p for p in self.partitions.values() if isinstance(p, PartitionPlan)]


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
