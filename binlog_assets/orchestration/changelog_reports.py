"""A consume round reported to Dagster: each partition's log line and metadata (a
materialization of the changelog's partition, or an observation when the round read no
record), and each source's observation (`kafka_sources.py`). The round measured what
the report shows (`rounds/report.py`): nothing is measured here."""

import dagster as dg

from binlog_assets.consume.checkpoint import disagreements
from binlog_assets.consume.lag import lags_of, waited_for_kafka
from binlog_assets.consume.run import STOP_INTERRUPTED, RunSummary
from binlog_assets.formats.event import (
    OP_CREATE,
    OP_DDL,
    OP_DELETE,
    OP_READ,
    OP_TRUNCATE,
    OP_UPDATE,
)
from binlog_assets.orchestration.kafka_sources import source_observation
from binlog_assets.orchestration.partitions import CHANGELOG_ASSET_KEY, partition_key
from binlog_assets.rounds.partition import PartitionOutcome, SinkTotals
from binlog_assets.rounds.plan import RunReport
from binlog_assets.rounds.report import RoundReport

# Change events by op, as the metadata names them.
OP_NAMES = {OP_CREATE: "inserts", OP_UPDATE: "updates", OP_DELETE: "deletes",
            OP_READ: "snapshot_reads", OP_TRUNCATE: "truncates", OP_DDL: "ddl"}


def per_table_metadata(summary: RunSummary) -> dg.TableMetadataValue:
    """Events per source table and op, as a table the UI renders."""
    counts: dict[str, dict[str, int]] = {}
    for (table, op), n in summary.counts.items():
        counts.setdefault(table, {})[op] = n
    columns = [dg.TableColumn("table", "string"),
               *(dg.TableColumn(name, "int") for name in OP_NAMES.values())]
    return dg.MetadataValue.table(
        records=[dg.TableRecord({"table": table, **{name: ops.get(op, 0)
                                                    for op, name in OP_NAMES.items()}})
                 for table, ops in sorted(counts.items())],
        schema=dg.TableSchema(columns=columns))


def summary_metadata(summary: RunSummary, lag_at_end: int | None,
                     version: int | None) -> dict[str, dg.MetadataValue]:
    md: dict[str, dg.MetadataValue] = {
        "topic": dg.MetadataValue.text(summary.topic),
        # Text, not a number: a partition's number is not a measure to plot.
        "partition": dg.MetadataValue.text(str(summary.partition)),
        "start_offset": dg.MetadataValue.int(summary.start_offset),
        "checkpoint_source": dg.MetadataValue.text(summary.checkpoint_source),
        "committed_offset": dg.MetadataValue.int(summary.committed_offset),
        "end_offset_at_start": dg.MetadataValue.int(summary.end_offset),
        "records": dg.MetadataValue.int(summary.records),
        "events": dg.MetadataValue.int(summary.events),
        "dead_lettered": dg.MetadataValue.int(summary.dead_lettered),
        "breakers_open": dg.MetadataValue.int(summary.breakers_open),
        "skipped_already_done": dg.MetadataValue.int(summary.skipped_already_done),
        "throughput_records_per_s": dg.MetadataValue.float(round(summary.throughput, 1)),
        "consume_seconds": dg.MetadataValue.float(round(summary.seconds, 3)),
        "kafka_wait_seconds": dg.MetadataValue.float(round(summary.kafka_wait_seconds, 3)),
        "stop_reason": dg.MetadataValue.text(summary.stop_reason),
        "per_table": per_table_metadata(summary),
        # The source's binlog history the partition is in: a step up is a failover, a
        # binlog reset or a re-snapshot (README: Failover, binlog resets and snapshots).
        "source_lineage": dg.MetadataValue.int(summary.lineage),
    }
    if summary.lineages_raised:
        md["lineages_raised"] = dg.MetadataValue.json(summary.lineages_raised)
    per_op = summary.per_op()
    # Every count, zeros included, so that each plots as one unbroken series.
    for op, name in OP_NAMES.items():
        md[name] = dg.MetadataValue.int(per_op.get(op, 0))
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


def report_round(context: dg.OpExecutionContext, report: RoundReport, *, final: bool,
                 one_line: bool = False) -> bool:
    """Each partition's log line and metadata, and the sources' observations; whether
    any record was read. `final`: the run's output will carry the metadata (else it
    fails or was interrupted, and each materialization is recorded here). `one_line`
    logs one line for all partitions, not one each (every log line is a write to
    Dagster's event log)."""
    outcomes, consumed = report.outcomes, report.consumed
    table_md = ({} if report.rows is None
                else {"dagster/row_count": dg.MetadataValue.int(report.rows)})
    lags = {partition_key(pl.topic, pl.partition): pl.lag for pl in report.lags}
    lines = []
    for outcome in outcomes:
        if outcome.error is not None:
            context.log.error(f"{outcome.key}: {type(outcome.error).__name__}: "
                              f"{outcome.error}")
            continue
        line = _log_partition(context, outcome, one_line=one_line)
        if line is not None:
            lines.append(line)
        metadata = {**summary_metadata(outcome.summary, lags.get(outcome.key),
                                       outcome.sink.version), **table_md}
        _record(context, outcome.key, metadata, consumed=consumed, final=final)
    if lines:
        context.log.info(_one_line(outcomes, lines))
    summaries = {o.key: o.summary for o in outcomes if o.summary is not None}
    _warn_kafka_wait(context, report.run, summaries)
    line = waited_for_kafka(report.run.kafka_conf, "the round's cluster check",
                            report.cluster_wait_seconds)
    if line is not None:
        context.log.warning(line)
    for source in report.run.sources:
        found = lags_of(report.lags, source.topics)
        context.log_event(source_observation(
            context.instance, source, found, summaries, context.run.run_id))
    return consumed


def _log_partition(context: dg.OpExecutionContext, outcome: PartitionOutcome, *,
                   one_line: bool) -> str | None:
    """Log what a partition's run did and what it warns of; with `one_line`, its part
    of the run's line is returned instead of logged."""
    summary, key = outcome.summary, outcome.key
    where = " in a worker process" if isinstance(outcome.sink, SinkTotals) else ""
    line = None
    if one_line:
        line = (f"{key} {summary.records} ({summary.start_offset}-"
                f"{summary.committed_offset}{where and ', worker'})")
    else:
        stopped = ("; stopped: the run was interrupted"
                   if summary.stop_reason == STOP_INTERRUPTED else "")
        context.log.info(
            f"{key}: {summary.records} records from {summary.start_offset} "
            f"({summary.checkpoint_source}) to {summary.committed_offset} in "
            f"{summary.seconds:.1f}s{where}; {summary.dead_lettered} dead-lettered"
            + stopped)
    for raised in summary.lineages_raised:
        context.log.warning(f"{key}: the source's binlog changed under the stream: "
                            f"{raised}")
    disagree = [f"{c.source}={c.offset}" for c in
                disagreements(summary.checkpoint_candidates, summary.start_offset)]
    if disagree:
        context.log.warning(f"{key}: checkpoint sources disagree with the chosen "
                            f"{summary.checkpoint_source}={summary.start_offset}: "
                            f"{disagree}")
    return line


def _record(context: dg.OpExecutionContext, key: str, metadata: dict, *, consumed: bool,
            final: bool) -> None:
    """A partition's metadata: an observation when the run read no record, else its
    materialization's (recorded here unless the run's output will carry it)."""
    if not consumed:
        context.log_event(dg.AssetObservation(
            asset_key=CHANGELOG_ASSET_KEY, partition=key, metadata=metadata))
    elif not final:
        # The run fails below, so its output records nothing: what did finish is
        # recorded here, so its committed offsets still show (and still count).
        context.log_event(dg.AssetMaterialization(
            asset_key=CHANGELOG_ASSET_KEY, partition=key, metadata=metadata))
    else:
        context.add_asset_metadata(metadata, partition_key=key)


def _one_line(outcomes: list[PartitionOutcome], lines: list[str]) -> str:
    """The run's partitions in one log line."""
    read = [o.summary for o in outcomes if o.summary is not None]
    return (f"{len(read)} partitions, {sum(r.records for r in read)} records, "
            f"{sum(r.dead_lettered for r in read)} dead-lettered"
            + ("; stopped: the run was interrupted"
               if any(r.stop_reason == STOP_INTERRUPTED for r in read) else "")
            + "; records (offsets) per partition: " + ", ".join(lines))


def _warn_kafka_wait(context: dg.OpExecutionContext, run: RunReport,
                     summaries: dict[str, RunSummary]) -> None:
    """A warning when the partition that waited longest for Kafka waited long."""
    waited = max(summaries.items(), key=lambda ks: ks[1].kafka_wait_seconds, default=None)
    line = None if waited is None else waited_for_kafka(
        run.kafka_conf, "for records below its end offset, its end offset or a commit",
        waited[1].kafka_wait_seconds, waiter=waited[0])
    if line is not None:
        context.log.warning(line)
