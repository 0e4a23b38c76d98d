"""Each source's Kafka topics as an asset upstream of the changelog (`kafka/<source>`),
observed by every consumer run: where each of its topic-partitions stands.

The changelog is partitioned by topic-partition, so the UI plots its metadata across
partitions. These observations are not partitioned: each numeric key names one
partition (`lag_records/shop:0`, `committed_offset/shop:0`), so the Plots view draws each
partition's own line over time, and the `partitions` table lists every partition with
its committed offset, end offset, lag, and the dead letters and time of the last run
that consumed it (carried over from the previous observation for the others).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

import dagster as dg

from binlog_assets.config import PipelineConfig, SourceConfig
from binlog_assets.consume.lag import PartitionLag
from binlog_assets.consume.run import RunSummary
from binlog_assets.orchestration.partitions import partition_key
from binlog_assets.orchestration.shared import ASSET_GROUP

PARTITION_COLUMNS = [
    dg.TableColumn("partition", "string", description="topic:partition"),
    dg.TableColumn("committed_offset", "int", description="the group's committed offset"),
    dg.TableColumn("end_offset", "int", description="the partition's log end offset"),
    dg.TableColumn("lag", "int", description="records not yet consumed"),
    dg.TableColumn("dead_lettered", "int",
                   description="records dead-lettered by the last run that consumed it"),
    dg.TableColumn("last_run", "string", description="that run's id and end time"),
]


def kafka_source_key(source: str) -> dg.AssetKey:
    return dg.AssetKey(["kafka", source])


def kafka_source_specs(pipeline: PipelineConfig) -> list[dg.AssetSpec]:
    return [
        dg.AssetSpec(
            kafka_source_key(s.name),
            group_name=ASSET_GROUP,
            kinds={"kafka"},
            description=(f"Kafka topics of source `{s.name}` ({s.format}): "
                         f"{', '.join(s.topics)}. Each consumer run records where every "
                         f"topic-partition stands: committed offset, end offset and lag "
                         f"per partition (one plot each) and a `partitions` table."),
            metadata={"topics": dg.MetadataValue.json(list(s.topics))},
        )
        for s in pipeline.sources
    ]


def _previous_rows(instance: dg.DagsterInstance, key: dg.AssetKey) -> dict[str, dict]:
    records = instance.fetch_observations(key, limit=1).records
    if not records or records[0].asset_observation is None:
        return {}
    table = records[0].asset_observation.metadata.get("partitions")
    if not isinstance(table, dg.TableMetadataValue):
        return {}
    return {r.data["partition"]: dict(r.data) for r in table.records}


def source_observation(
    instance: dg.DagsterInstance,
    source: SourceConfig,
    lags: Iterable[PartitionLag],
    summaries: Mapping[str, RunSummary],
    run_id: str,
) -> dg.AssetObservation:
    """Where `source`'s topic-partitions stand after a run that consumed `summaries`."""
    key = kafka_source_key(source.name)
    rows = _previous_rows(instance, key)
    ended = datetime.now(UTC).isoformat(timespec="seconds")
    metadata: dict[str, dg.MetadataValue] = {}
    total = 0
    for pl in sorted(lags, key=lambda x: (x.topic, x.partition)):
        name = partition_key(pl.topic, pl.partition)
        row = rows.setdefault(name, {"dead_lettered": 0, "last_run": ""})
        summary = summaries.get(name)
        if summary is not None:
            row["dead_lettered"] = summary.dead_lettered
            row["last_run"] = f"{run_id[:8]} at {ended}"
        row.update(partition=name, committed_offset=pl.checkpoint, end_offset=pl.high,
                   lag=pl.lag)
        total += pl.lag
        metadata[f"committed_offset/{name}"] = dg.MetadataValue.int(pl.checkpoint)
        metadata[f"lag_records/{name}"] = dg.MetadataValue.int(pl.lag)
    metadata["total_lag_records"] = dg.MetadataValue.int(total)
    metadata["partitions"] = dg.MetadataValue.table(
        records=[dg.TableRecord({c.name: row.get(c.name) for c in PARTITION_COLUMNS})
                 for _, row in sorted(rows.items()) if "end_offset" in row],
        schema=dg.TableSchema(columns=PARTITION_COLUMNS))
    return dg.AssetObservation(asset_key=key, metadata=metadata)
