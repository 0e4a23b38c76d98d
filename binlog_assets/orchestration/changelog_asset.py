"""The changelog asset: bounded consumer runs of Kafka topic-partitions, with no JVM.

Materializing partition `topic:partition` reads that partition from its checkpoint to
the end offset seen at the start, applies the configured handlers in lanes, and writes
every event to the changelog Delta table (delta-rs) in one idempotent commit per commit
point, before the Kafka commit. One Dagster run serves a range of partitions (the lag
sensor's batches, a backfill's `max_partitions_per_run`): each partition is its own
bounded run with its own checkpoint, tracker, fence and metadata, several at a time in
the run's process. Its metadata (offsets, counts, lag, throughput, Delta version) is
what the UI charts, and the committed offset in it is itself a checkpoint source.

A run is fenced (invariant 4, `lakehouse/fence.py`): once another run moved its
partition's checkpoint, it writes nothing more and fails clearly.
"""

from collections.abc import Iterator

import dagster as dg

from binlog_assets.orchestration.changelog_reports import report_round
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.orchestration.metadata_checkpoint import latest_metadata_checkpoint
from binlog_assets.orchestration.partitions import CHANGELOG_ASSET_KEY, kafka_partitions_def
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import ASSET_GROUP
from binlog_assets.rounds.round import RoundOptions, consume_round


@dg.asset(
    key=CHANGELOG_ASSET_KEY,
    partitions_def=kafka_partitions_def,
    group_name=ASSET_GROUP,
    kinds={"kafka", "delta"},
    # A run that consumed nothing records an observation, not a materialization that
    # would start replica and dbt builds.
    output_required=False,
)
def changelog(
    context: dg.AssetExecutionContext,
    config: ChangelogRunConfig,
    binlake: BinlakeResource,
) -> Iterator[dg.MaterializeResult]:
    """Bronze changelog: every change event of a Kafka topic-partition, appended to the
    `changelog` Delta table exactly once (transaction id per group and partition), by a
    bounded consumer run from the partition's checkpoint to the end offset at its start.
    One run serves one partition or a range of them; each gets its own metadata:
    `records` are the Kafka records read, `events` the row changes decoded from them
    (a record may carry several, or none: a tombstone, a transaction marker). A run that
    read no record records an observation instead of a materialization. Where each
    topic-partition stands over time is on the `kafka/<source>` assets upstream."""
    kafka_conf = binlake.kafka_conf()
    report = consume_round(
        binlake.pipeline, kafka_conf, list(context.partition_keys), config,
        group=binlake.group_id(),
        options=RoundOptions(
            metadata_checkpoint=lambda key: latest_metadata_checkpoint(context.instance, key),
            # A terminated run still records what its partitions committed before it ends.
            on_interrupt=lambda stopped: report_round(context, stopped, final=False)))
    failed = report.failed
    consumed = report_round(context, report, final=not failed)
    if failed:
        first = failed[0].error
        raise RuntimeError(
            f"{len(failed)} of {len(report.outcomes)} partitions failed: "
            + "; ".join(f"{o.key}: {o.error}" for o in failed)) from first
    if consumed:
        yield dg.MaterializeResult()
