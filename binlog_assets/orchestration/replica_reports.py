"""What a replica build reports, for the replica assets, the follower run and the
re-sync and load jobs alike: the assets' keys, the metadata of an apply, and the
row-count check (the replica's rows against what the changelog says at the applied
version)."""

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import dagster as dg

from binlog_assets.config import PipelineConfig
from binlog_assets.formats.event import FIRST_LINEAGE, LEGACY_SNAPSHOT_LINEAGE

if TYPE_CHECKING:
    from binlog_assets.lakehouse.audit_arrow import LiveKeys
    from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
    from binlog_assets.lakehouse.replica.plan import ReplicaResult
    from binlog_assets.orchestration.resources import BinlakeResource

ROW_COUNT_CHECK = "row_count_matches_changelog"
SOURCE_DELAY_CHECK = "source_delay"


def row_count_check_result(key: dg.AssetKey, live: int, expected: int,
                           version: int, *, at_least: bool = False) -> dg.AssetCheckResult:
    """With `at_least` (changelog retention on: keys whose every change is older than the
    retention are in the replica, no longer in the changelog) the replica may hold more."""
    passed = live >= expected if at_least else live == expected
    says = (f"at least {expected} live keys (changelog retention is on)" if at_least
            else f"{expected} live keys")
    return dg.AssetCheckResult(
        asset_key=key, check_name=ROW_COUNT_CHECK, passed=passed,
        metadata={"replica_rows": dg.MetadataValue.int(live),
                  "changelog_live_keys": dg.MetadataValue.int(expected),
                  "changelog_version": dg.MetadataValue.int(version)},
        description=(f"{live} rows, as the changelog says at version {version}"
                     if live == expected else
                     f"{live} rows in the replica, {says} in the changelog at version "
                     f"{version}"),
    )


def source_delay(result: "ReplicaResult", now: float) -> float | None:
    """Seconds from the source commit of the newest change the apply wrote to `now` (a
    Unix time); None when the apply wrote no change with a recorded source time."""
    if result.last_source_ts is None or result.skipped:
        return None
    return round(max(0.0, now - result.last_source_ts / 1000), 3)


def source_delay_check(key: dg.AssetKey, result: "ReplicaResult", limit: float,
                       now: float) -> dg.AssetCheckResult:
    """`source_delay`: the newest change reached the replica within `limit` seconds of
    its source commit. A warning, not an error: a catch-up after downtime is late by
    design, and the replica is still right."""
    delay = source_delay(result, now)
    if delay is None:
        return dg.AssetCheckResult(
            asset_key=key, check_name=SOURCE_DELAY_CHECK, passed=True,
            severity=dg.AssetCheckSeverity.WARN,
            description="no change with a recorded source time in this apply")
    return dg.AssetCheckResult(
        asset_key=key, check_name=SOURCE_DELAY_CHECK, passed=delay <= limit,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"source_delay_seconds": dg.MetadataValue.float(delay),
                  "limit_seconds": dg.MetadataValue.float(float(limit))},
        description=(f"the newest change reached the replica {delay:.1f} s after its "
                     f"source commit (limit {limit:g} s: dagster.replica_delay_alert_seconds)"))


def replica_key(name: str) -> dg.AssetKey:
    return dg.AssetKey(["replica", name])


def replica_names(pipeline: PipelineConfig) -> list[str]:
    return sorted({t.replica for s in pipeline.sources for t in s.tables})


def counted_rows(builder: "ReplicaBuilder", name: str, key_rule: str | None) -> int:
    """The replica's live rows, as `_current` holds them (`_op` neither a delete nor a
    truncate); an append-only replica has no live rows to tell apart, so all its rows
    count; 0 before it has a table. Counted by delta-rs from the `_op` column, no Spark
    job (a second or more on a busy follower); by Spark when the table has a reader
    feature delta-rs refuses (`lakehouse.table_features`)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake.exceptions import DeltaProtocolError

    from binlog_assets.formats.event import OP_DELETE, OP_TRUNCATE
    from binlog_assets.identifiers import qualified
    from binlog_assets.lakehouse.delta_log import open_log, table_location
    from binlog_assets.lakehouse.replica.plan import APPEND_ONLY

    if key_rule is None:
        return 0
    append = key_rule == APPEND_ONLY
    table = builder.table_name(name)
    try:
        dataset = open_log(table_location(builder.spark, *table)).to_pyarrow_dataset()
    except DeltaProtocolError:
        view = table if append else builder.current_view_name(name)
        return builder.spark.table(qualified(*view)).count()
    if append:
        return dataset.count_rows()
    # Read, not filtered in the scan: files of one table may type `_op` as string or as
    # string_view, which Arrow's scan filter cannot compare.
    ops = dataset.to_table(columns=["_op"]).column("_op").cast(pa.string())
    gone = pc.sum(pc.is_in(ops, value_set=pa.array([OP_DELETE, OP_TRUNCATE]))).as_py()
    return len(ops) - (gone or 0)


def row_count_check(builder: "ReplicaBuilder", name: str, key_rule: str | None, live: int,
                    version: int, counter: "LiveKeys | None" = None) -> dg.AssetCheckResult:
    """`row_count_matches_changelog` for `live` rows counted at changelog `version`,
    against the changelog's count by delta-rs (`audit_arrow`); `counter`, a `LiveKeys`
    of this replica kept across checks, counts only the versions added since its last."""
    from binlog_assets.lakehouse.audit_arrow import expected_rows
    from binlog_assets.lakehouse.replica.plan import APPEND_ONLY

    append_only = key_rule == APPEND_ONLY
    expected = (counter.count(version) if counter is not None
                and counter.append_only == append_only
                else expected_rows(builder.pipeline, name, version, append_only=append_only))
    return row_count_check_result(
        replica_key(name), live, expected, version,
        at_least=builder.pipeline.lakehouse.changelog_retention_days is not None)


def replica_metadata(result: "ReplicaResult", live_rows: int | None) -> dict[str, dg.MetadataValue]:
    """What an apply did; `rows` (live rows after it) when counted."""
    md = {} if live_rows is None else {"rows": dg.MetadataValue.int(live_rows),
                                       "dagster/row_count": dg.MetadataValue.int(live_rows)}
    md |= {
        "changelog_rows_read": dg.MetadataValue.int(result.rows),
        "applied_changelog_version": dg.MetadataValue.int(result.applied_version),
        "upserts": dg.MetadataValue.int(result.upserts),
        "deletes": dg.MetadataValue.int(result.deletes),
        "tombstones": dg.MetadataValue.int(result.tombstones),
        "truncated": dg.MetadataValue.int(result.truncated),
    }
    if result.last_position is not None:
        md["last_position"] = dg.MetadataValue.text(position_label(result.last_position))
        # Which of the source's binlog histories the replica is in, and the server and
        # GTID its newest change was written with (a failover shows as a step up).
        md["source_lineage"] = dg.MetadataValue.int(max(int(result.last_position[0]),
                                                        FIRST_LINEAGE))
    if result.last_server_id is not None:
        md["source_server_id"] = dg.MetadataValue.int(result.last_server_id)
    if result.last_gtid is not None:
        md["source_gtid"] = dg.MetadataValue.text(result.last_gtid)
    delay = source_delay(result, time.time())
    if delay is not None:
        # How far behind its source the replica was as this apply ended.
        md["last_source_commit"] = dg.MetadataValue.timestamp(result.last_source_ts / 1000)
        md["source_delay_seconds"] = dg.MetadataValue.float(delay)
    if result.key_rule is not None:
        md["key_rule"] = dg.MetadataValue.text(result.key_rule)
    if result.warning:
        md["warning"] = dg.MetadataValue.text(result.warning)
    if result.schema_changes:
        # What the source's DDL did to the replica, as the apply made it (README: Schema
        # changes).
        md["schema_changes"] = dg.MetadataValue.json(list(result.schema_changes))
    return md


def replica_table_metadata(builder: "ReplicaBuilder", name: str) -> dict[str, dg.MetadataValue]:
    """The replica table's columns as they are after the apply (they follow the source's
    schema changes), and its history table's when it keeps one; nothing before it has a
    table."""
    from binlog_assets.lakehouse.delta_log import table_exists, table_location
    from binlog_assets.orchestration.table_metadata import (
        REPLICA_COLUMN_DOCS,
        delta_column_schema,
    )

    tables = [("dagster/column_schema", builder.table_name(name))]
    # Only when configured: a catalog lookup is a round trip in a follower's every apply.
    if any(t.history for s in builder.pipeline.sources for t in s.tables if t.replica == name):
        tables.append(("history_column_schema", builder.history_name(name)))
    md = {}
    for key, (database, table) in tables:
        if table_exists(builder.spark, database, table):
            schema = delta_column_schema(table_location(builder.spark, database, table),
                                         REPLICA_COLUMN_DOCS)
            md[key] = dg.MetadataValue.table_schema(schema)
    return md


def position_label(position: tuple[int, ...]) -> str:
    """A changelog position as a reader knows it: binlog file index and byte position,
    the row within the event and the Kafka offset (`(1, 1, 381614, 0, 10, 0)` reads
    `000001:381614 row 0, offset 10`); snapshot reads and lineages past the first say so."""
    lineage, file, pos, row, offset, _row_index = position
    where = f"{file:06d}:{pos}{'' if row < 0 else f' row {row}'}, offset {offset}"
    where = f"snapshot, {where}" if lineage == LEGACY_SNAPSHOT_LINEAGE or row < 0 else where
    return where if lineage <= FIRST_LINEAGE else f"lineage {lineage}, {where}"


def failure_line(exc: Exception) -> str:
    """An apply's error in one line: Spark's carry the JVM's stack trace after it."""
    return str(exc).strip().split("\n", 1)[0]


def replicas_failed(failed: list[tuple[str, Exception]], total: int) -> RuntimeError:
    """The error a run raises once it reported every replica that did apply."""
    error = RuntimeError(f"{len(failed)} of {total} replicas failed: "
                         + "; ".join(f"{name}: {failure_line(exc)}" for name, exc in failed))
    error.__cause__ = failed[0][1]
    return error


def applied_events(binlake: "BinlakeResource", name: str, description: str,
                   metadata: dict[str, dg.MetadataValue], log: dg.DagsterLogManager
                   ) -> Iterator[dg.AssetMaterialization | dg.AssetCheckEvaluation]:
    """The replica applied as a replica run would (rows a re-sync or a load appended),
    reported with its row-count check, which counts those rows on both sides."""
    from binlog_assets.lakehouse.replica.builder import ReplicaBuilder

    builder = ReplicaBuilder(binlake.spark(), binlake.pipeline)
    # A follower may have applied the rows first: this apply then finds the replica at
    # the changelog's version and reports it as it stands.
    result = builder.apply(name)
    log.info(f"replica {name}: {result}")
    live = counted_rows(builder, name, result.key_rule)
    yield dg.AssetMaterialization(asset_key=replica_key(name), description=description,
                                  metadata=replica_metadata(result, live) | metadata)
    check = row_count_check(builder, name, result.key_rule, live, result.applied_version)
    yield dg.AssetCheckEvaluation(
        asset_key=check.asset_key, check_name=check.check_name, passed=check.passed,
        severity=check.severity, metadata=check.metadata, description=check.description)
