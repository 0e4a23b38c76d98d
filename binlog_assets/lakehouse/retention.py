"""Changelog retention: rows ingested more than `lakehouse.changelog_retention_days` ago
that every replica has applied leave the changelog, in one delta-rs commit the replicas'
change data feed skips; everything else stays.

How rows are chosen and why no replica sees them go: docs/architecture.md, "Changelog
retention".
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from binlog_assets.config import PipelineConfig
from binlog_assets.identifiers import qualified
from binlog_assets.lakehouse.changelog import (
    TABLE_PROPERTIES,
    changelog_name,
    changelog_uri,
)
from binlog_assets.lakehouse.changelog_rows import commit_metadata
from binlog_assets.lakehouse.delta_log import delta_rs_uri, table_detail, table_exists, txn_version
from binlog_assets.lakehouse.maintenance import live_files
from binlog_assets.lakehouse.replica.plan import APPEND_ONLY, recorded_rule
from binlog_assets.lakehouse.replica.routes import replica_routes
from binlog_assets.lakehouse.transactions import APP_ID

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction

    from binlog_assets.lakehouse.replica.builder import ReplicaBuilder

# A retention commit writes the younger rows of the files it replaces into a folder of
# its own in the table's, staged as a Delta table there (delta-rs writes the files and
# their statistics) whose own log is deleted once the files are known.
STAGING_PREFIX = "retention-"
_STATS_COLUMNS = "delta.dataSkippingStatsColumns"


@dataclass(frozen=True)
class Retention:
    """What changelog retention did."""

    table: str
    cutoff: datetime  # rows ingested before this went, when every replica applied them
    applied_version: int | None  # the lowest changelog version every replica applied
    files_before: int
    bytes_before: int
    files_after: int
    bytes_after: int
    files_removed: int = 0  # files entirely below the cutoff
    files_rewritten: int = 0  # files partly below it, replaced by their younger rows
    rows_removed: int = 0
    note: str = ""


def applied_by_every_replica(builder: ReplicaBuilder, current: int
                             ) -> tuple[int | None, list[str]]:
    """The lowest changelog version every replica (and history table) has applied, and
    the tables that have applied none (then the version is None: they need every row).
    With no replica configured nothing reads the changelog: `current`."""
    versions, waiting = [], []
    for name, route in sorted(replica_routes(builder.pipeline).items()):
        replica = builder.table_name(name)
        targets = [replica]
        # A history table is built alongside unless the replica is an append-only log.
        if route.history and table_exists(builder.spark, *replica) and recorded_rule(
                route, table_detail(builder.spark, *replica)["properties"]) != APPEND_ONLY:
            targets.append(builder.history_name(name))
        for target in targets:
            version = txn_version(builder.spark, *target, APP_ID)
            if version is None:
                waiting.append(qualified(*target))
            else:
                versions.append(version)
    if waiting:
        return None, waiting
    return (min(versions) if versions else current), []


def retain_changelog(pipeline: PipelineConfig, applied: int | None, *,
                     now: datetime | None = None) -> Retention:
    """Delete the changelog rows ingested more than `lakehouse.changelog_retention_days`
    before `now` that are in files already there at version `applied` (see the module
    docstring); None applied deletes nothing."""
    from deltalake import CommitProperties, DeltaTable
    from deltalake.transaction import RemoveAction

    days = pipeline.lakehouse.changelog_retention_days
    if days is None:
        raise ValueError("lakehouse.changelog_retention_days is not set: the changelog "
                         "keeps every row")
    now = now or datetime.now(UTC)
    cutoff = now - timedelta(days=days)
    # Statistics keep timestamps in whole milliseconds (a maximum rounded down): against
    # a whole-millisecond cutoff they decide exactly which rows are older.
    cutoff = cutoff.replace(microsecond=cutoff.microsecond // 1000 * 1000)
    uri = changelog_uri(pipeline)
    before = live_files(uri)
    done = Retention(qualified(*changelog_name(pipeline)), cutoff, applied, *before, *before)
    if applied is None:
        return done
    rs_uri = delta_rs_uri(uri)
    table = DeltaTable(rs_uri)
    settled = set(DeltaTable(rs_uri, version=applied).get_add_actions()
                  .column("path").to_pylist())
    files = table.get_add_actions(flatten=True)
    old, mixed, rows_out = [], [], 0
    for path, size, rows, first, last in zip(*(
            files.column(c).to_pylist() for c in (
                "path", "size_bytes", "num_records", "min.ingested_at", "max.ingested_at")),
            strict=True):
        if path in settled and first is not None and last is not None and first < cutoff:
            (old if last < cutoff else mixed).append((path, size))
            rows_out += rows or 0
    if not old and not mixed:
        return done
    adds, kept = _young_rows(table, rs_uri, [p for p, _ in mixed], cutoff)
    # Every action without data change: the change feed replicas read skips it (nothing
    # comes back as an insert), and append-only Delta refuses only removes of data.
    stamp = int(now.timestamp() * 1000)
    removes = [RemoveAction(path, False, stamp, size, {}) for path, size in old + mixed]
    table.create_write_transaction(
        [*adds, *removes], "append", table.schema(),
        commit_properties=CommitProperties(
            custom_metadata={"userMetadata": commit_metadata("retention", [])}))
    return Retention(done.table, cutoff, applied, *before, *live_files(uri),
                     files_removed=len(old), files_rewritten=len(mixed),
                     rows_removed=rows_out - kept)


def _young_rows(table: DeltaTable, uri: str, paths: list[str], cutoff: datetime
                ) -> tuple[list[AddAction], int]:
    """Write the rows ingested at or after `cutoff` of the table's files `paths` into new
    files of the table (not yet committed): their add actions, without data change, and
    how many rows they hold."""
    if not paths:
        return [], 0
    import pyarrow.dataset as pds
    from deltalake import write_deltalake
    from deltalake.transaction import AddAction
    from pyarrow.fs import FileSelector

    dataset = table.to_pyarrow_dataset()
    wanted = set(paths)
    young = pds.FileSystemDataset(
        [f for f in dataset.get_fragments() if f.path in wanted], dataset.schema,
        dataset.format, dataset.filesystem).to_table(filter=pds.field("ingested_at") >= cutoff)
    folder = f"{STAGING_PREFIX}{uuid.uuid4().hex}"
    write_deltalake(f"{uri.rstrip('/')}/{folder}", young,
                    configuration={_STATS_COLUMNS: TABLE_PROPERTIES[_STATS_COLUMNS]})
    fs, log = dataset.filesystem, f"{folder}/_delta_log"
    adds = []
    for info in fs.get_file_info(FileSelector(log)):
        if info.path.endswith(".json"):
            for line in fs.open_input_stream(info.path).read().splitlines():
                add = json.loads(line).get("add")
                if add:
                    adds.append(AddAction(f"{folder}/{add['path']}", add["size"], {},
                                          add["modificationTime"], False, add["stats"]))
    fs.delete_dir(log)
    return adds, young.num_rows
