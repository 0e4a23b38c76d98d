"""A partition's checkpoint as its latest materialization recorded it (the third source
in the checkpoint precedence, after the run config and the changelog's own state)."""

from __future__ import annotations

import dagster as dg

from binlog_assets.consume.checkpoint import METADATA, Checkpoint
from binlog_assets.orchestration.partitions import CHANGELOG_ASSET_KEY


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
