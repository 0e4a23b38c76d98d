"""Data versions and provenance on the follower's replica materializations: what lets the
asset graph say "Unsynced" only for a replica that is behind.

A replica (unpartitioned) depends on every changelog partition. Without provenance,
Dagster calls it stale once any changelog partition materialized after it, for whatever
table. With provenance it asks, per changelog partition, whether a materialization after
the replica's cursor (`dagster/input_event_pointer/changelog`) has a data version other
than the one before it. So the follower reports:

- on each apply that changed a replica, the data version `changelog@<applied version>`
  and, as the cursor, the last changelog materialization whose commits that version
  holds (`changelog_cursor`: every consumer run's materialization names the changelog
  version it wrote, `changelog_version`);
- when the changelog moved only for other tables (its commits' surveys say so), the
  replica is current at the newer version with the same data: an "in sync" materialization
  with the data version unchanged and the cursor moved on (tagged `binlake/in_sync`, so
  dbt does not rebuild for it, and at most every `sync_seconds` per replica).

A replica behind its tables (a changelog materialization after its cursor) stays
Unsynced until its apply is reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import dagster as dg
from dagster._core.definitions.data_version import (
    CODE_VERSION_TAG,
    DATA_VERSION_TAG,
    get_input_data_version_tag,
    get_input_event_pointer_tag,
)

from binlog_assets.orchestration.partitions import CHANGELOG_ASSET_KEY
from binlog_assets.orchestration.shared import IN_SYNC_TAG

# The changelog materializations a cursor looks back over: consumer runs record theirs
# after their commits, a few runs out of order at most.
LOOKBACK = 200
# The replicas' code version in their provenance (they have none of their own; Dagster
# only compares it with the asset's, which is unset).
CODE_VERSION = "binlake-follower"


def data_version(applied_version: int) -> str:
    return f"changelog@{applied_version}"


def changelog_cursor(instance: dg.DagsterInstance, version: int) -> int | None:
    """The storage id up to which every changelog materialization holds only changelog
    versions at or below `version`. One whose commit is newer stops the cursor before it
    (the replica may be shown behind a little longer, never current while it is not).
    With none recorded yet, the event log's last id: any later one is new. (Dagster
    reads a null or zero cursor as "nothing after it is new".)"""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=CHANGELOG_ASSET_KEY), limit=LOOKBACK,
        ascending=False).records
    cursor = (records[0].storage_id if records
              else instance.event_log_storage.get_maximum_record_id())
    for record in records:  # newest first: the last one stopped at is the oldest
        written = _written_version(record)
        if written is not None and written > version:
            cursor = record.storage_id - 1
    return cursor if cursor else None


def _written_version(record: dg.EventLogRecord) -> int | None:
    materialization = record.asset_materialization
    value = materialization.metadata.get("changelog_version") if materialization else None
    return None if value is None else int(value.value)


def latest_changelog_id(instance: dg.DagsterInstance) -> int | None:
    records = instance.fetch_materializations(CHANGELOG_ASSET_KEY, limit=1).records
    return records[0].storage_id if records else None


def provenance_tags(version: str | None, cursor: int | None, changelog_version: int
                    ) -> dict[str, str]:
    """The tags by which Dagster reads a materialization's data version and what it was
    made from (`DataProvenance.from_tags`)."""
    tags = {CODE_VERSION_TAG: CODE_VERSION,
            get_input_data_version_tag(CHANGELOG_ASSET_KEY): data_version(changelog_version),
            get_input_event_pointer_tag(CHANGELOG_ASSET_KEY):
                "NULL" if cursor is None else str(cursor)}
    if version is not None:
        tags[DATA_VERSION_TAG] = version
    return tags


class InSync:
    """What the follower last reported of each replica (data version, cursor, when), and
    the in-sync materializations due when the changelog moved for other tables only."""

    def __init__(self, instance: dg.DagsterInstance, every: float) -> None:
        self.instance, self.every = instance, every
        self.reported: dict[str, tuple[str | None, int | None, float]] = {}
        # The metadata of each replica's last change, carried by its in-sync reports so
        # the UI's latest materialization still shows its rows and columns.
        self.metadata: dict[str, dict] = {}
        self._seen_changelog: int | None = None
        # Cursors looked up since the last poll, by changelog version: a round's applies
        # all go up to one version. A cursor found a little earlier is still safe: it
        # only stops before changelog materializations recorded since (shown behind).
        self._cursors: dict[int, int | None] = {}

    def cursor(self, version: int) -> int | None:
        if version not in self._cursors:
            self._cursors[version] = changelog_cursor(self.instance, version)
        return self._cursors[version]

    def applied(self, name: str, applied_version: int, now: float,
                metadata: dict | None = None) -> tuple[dict[str, str], int | None]:
        """The tags of an apply's materialization (with `metadata`), and its cursor."""
        version = data_version(applied_version)
        cursor = self.cursor(applied_version)
        self.reported[name] = (version, cursor, now)
        self.metadata[name] = dict(metadata or {})
        return provenance_tags(version, cursor, applied_version), cursor

    def due(self, names: list[str], version: int, now: float,
            current_as_of: Callable[[str], int | None] = lambda name: None
            ) -> list[dg.AssetMaterialization]:
        """In-sync materializations of `names` (current at changelog `version`) whose
        cursor is behind the changelog's materializations, at most every `every` s each.
        `current_as_of(name)`: the newest source commit time (ms) the replica's source has
        in the changelog, which an idle replica is current as of (heartbeats move it)."""
        from binlog_assets.orchestration.replica_reports import replica_key

        self._cursors.clear()  # a new poll: the next round looks its cursors up anew
        latest = latest_changelog_id(self.instance)
        if latest is None:
            return []
        cursor = None
        out = []
        for name in names:
            last = self.reported.get(name) or self._from_instance(name)
            if last is None:
                continue  # never materialized: Missing is the truth
            known, at, when = last
            if at is not None and at >= latest or now - when < self.every:
                continue
            if cursor is None:
                cursor = self.cursor(version)
            if cursor is None or (at is not None and cursor <= at):
                continue
            self.reported[name] = (known, cursor, now)
            metadata = {**self.metadata.get(name, {}),
                        "in_sync_with_changelog_version": dg.MetadataValue.int(version)}
            as_of = current_as_of(name)
            if as_of is not None:
                metadata["source_current_as_of"] = dg.MetadataValue.timestamp(as_of / 1000)
                metadata["source_delay_seconds"] = dg.MetadataValue.float(
                    round(max(0.0, time.time() - as_of / 1000), 3))
            out.append(dg.AssetMaterialization(
                asset_key=replica_key(name), metadata=metadata,
                tags={**provenance_tags(known, cursor, version), IN_SYNC_TAG: "true"}))
        return out

    def _from_instance(self, name: str) -> tuple[str | None, int | None, float] | None:
        """The replica's last materialization before this run: its data version and
        cursor (None when it recorded none)."""
        from binlog_assets.orchestration.replica_reports import replica_key

        records = self.instance.fetch_materializations(replica_key(name), limit=1).records
        if not records:
            return None
        tags = records[0].event_log_entry.tags or {}
        materialization = records[0].asset_materialization
        self.metadata[name] = {k: v for k, v in (materialization.metadata if materialization
                                                 else {}).items()
                               if k not in ("in_sync_with_changelog_version",
                                            "source_current_as_of")}
        pointer = tags.get(get_input_event_pointer_tag(CHANGELOG_ASSET_KEY))
        cursor = int(pointer) if pointer and pointer.isdigit() else None
        self.reported[name] = (tags.get(DATA_VERSION_TAG), cursor, float("-inf"))
        return self.reported[name]
