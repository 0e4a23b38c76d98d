"""A partition's checkpoint as its latest materialization recorded it (the third source
in the checkpoint precedence, after the run config and the changelog's own state)."""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from binlog_assets.consume.checkpoint import METADATA, Checkpoint
from binlog_assets.orchestration.partitions import CHANGELOG_ASSET_KEY


def latest_metadata_checkpoint(instance: dg.DagsterInstance, key: str) -> Checkpoint | None:
    """The committed offset recorded by this partition's latest materialization."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=CHANGELOG_ASSET_KEY, asset_partitions=[key]), limit=1
    ).records
    return _checkpoint(records[0]) if records else None


def latest_metadata_checkpoints(instance: dg.DagsterInstance, keys: Sequence[str]
                                ) -> dict[str, Checkpoint | None]:
    """`latest_metadata_checkpoint` of each of `keys`, in two queries for all of them
    (a follower round's partitions), not one each."""
    latest = instance.get_latest_storage_id_by_partition(
        CHANGELOG_ASSET_KEY, dg.DagsterEventType.ASSET_MATERIALIZATION, set(keys))
    found: dict[int, dg.EventLogRecord] = {}
    if latest:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=CHANGELOG_ASSET_KEY,
                                  storage_ids=list(latest.values())), limit=len(latest)).records
        found = {r.storage_id: r for r in records}
    return {key: _checkpoint(found[latest[key]]) if latest.get(key) in found else None
            for key in keys}


def _checkpoint(record: dg.EventLogRecord) -> Checkpoint | None:
    mat = record.asset_materialization
    value = mat.metadata.get("committed_offset") if mat else None
    return None if value is None else Checkpoint(int(value.value), METADATA)
