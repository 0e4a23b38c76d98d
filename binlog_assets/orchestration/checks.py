"""Asset checks: is the changelog keeping up, and do its checkpoint sources agree?

`changelog_lag_check` fails when any known topic-partition lags more than
`dagster.max_lag_records`. `checkpoint_agreement_check` compares, per partition, the
three places a resume point is recorded: the changelog's Delta transaction state, the
latest materialization's `committed_offset` metadata and the group's Kafka committed
offset. They should be equal after every finished run; a difference means a run died
between two of them, or something else commits for the group, and is reported (never
silently resolved: the run's precedence still decides where a run resumes).
"""

import dagster as dg

from binlog_assets.consume.lag import PartitionLag, measure_lag
from binlog_assets.orchestration.metadata_checkpoint import latest_metadata_checkpoint
from binlog_assets.orchestration.partitions import (
    CHANGELOG_ASSET_KEY,
    KAFKA_PARTITIONS_NAME,
    partition_key,
)
from binlog_assets.orchestration.resources import BinlakeResource


def _known_lags(context: dg.AssetCheckExecutionContext, binlake: BinlakeResource
                ) -> list[PartitionLag]:
    known = set(context.instance.get_dynamic_partitions(KAFKA_PARTITIONS_NAME))
    topics = [t for s in binlake.pipeline.sources for t in s.topics]
    return [pl for pl in measure_lag(binlake.kafka_conf(), binlake.group_id(), topics)
            if partition_key(pl.topic, pl.partition) in known]


@dg.asset_check(asset=CHANGELOG_ASSET_KEY, name="changelog_lag_check",
                description="Every topic-partition lags at most dagster.max_lag_records.")
def changelog_lag_check(context: dg.AssetCheckExecutionContext,
                        binlake: BinlakeResource) -> dg.AssetCheckResult:
    limit = binlake.pipeline.dagster.max_lag_records
    lags = {partition_key(pl.topic, pl.partition): pl.lag for pl in _known_lags(context, binlake)}
    over = {k: v for k, v in lags.items() if v > limit}
    return dg.AssetCheckResult(
        passed=not over,
        metadata={
            "max_lag_records": dg.MetadataValue.int(max(lags.values(), default=0)),
            "total_lag_records": dg.MetadataValue.int(sum(lags.values())),
            "partitions_over_limit": dg.MetadataValue.table(
                records=[dg.TableRecord({"partition": k, "lag_records": v})
                         for k, v in sorted(over.items())],
                schema=dg.TableSchema(columns=[dg.TableColumn("partition", "string"),
                                               dg.TableColumn("lag_records", "int")])),
            # Text: a setting, not a measure to plot over time.
            "limit": dg.MetadataValue.text(f"{limit} records (dagster.max_lag_records)"),
        },
        description=(f"{len(over)} of {len(lags)} partitions lag more than {limit} records"
                     if over else f"all {len(lags)} partitions within {limit} records"),
    )


CHECKPOINT_COLUMNS = [
    dg.TableColumn("partition", "string"),
    dg.TableColumn("changelog", "int", description="the changelog's transaction state"),
    dg.TableColumn("metadata", "int", description="the latest materialization's "
                                                  "committed_offset"),
    dg.TableColumn("kafka", "int", description="the group's committed offset"),
    dg.TableColumn("agree", "bool"),
]


# Reads the changelog's transaction state with delta-rs: no Spark, no catalog lock.
@dg.asset_check(asset=CHANGELOG_ASSET_KEY, name="checkpoint_agreement_check",
                description="Changelog transaction state, materialization metadata and Kafka "
                            "committed offsets agree for every partition.")
def checkpoint_agreement_check(context: dg.AssetCheckExecutionContext,
                               binlake: BinlakeResource) -> dg.AssetCheckResult:
    from binlog_assets.lakehouse.changelog import ChangelogWriter

    writer = ChangelogWriter(binlake.pipeline)
    group = binlake.group_id()
    rows = {}
    for pl in _known_lags(context, binlake):
        key = partition_key(pl.topic, pl.partition)
        meta = latest_metadata_checkpoint(context.instance, key)
        rows[key] = {
            "changelog": writer.checkpoint(group, pl.topic, pl.partition),
            "metadata": None if meta is None else meta.offset,
            "kafka": pl.committed,
        }
    disagree = {k: v for k, v in rows.items() if len(set(v.values())) > 1}
    return dg.AssetCheckResult(
        passed=not disagree,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "checkpoints": dg.MetadataValue.table(
                records=[dg.TableRecord({"partition": k, **v, "agree": k not in disagree})
                         for k, v in sorted(rows.items())],
                schema=dg.TableSchema(columns=CHECKPOINT_COLUMNS)),
            "partitions_disagreeing": dg.MetadataValue.int(len(disagree)),
        },
        description=(f"{len(disagree)} partitions disagree: {sorted(disagree)}" if disagree
                     else f"all {len(rows)} partitions agree"),
    )
