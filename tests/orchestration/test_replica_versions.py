"""Provenance on the follower's replica materializations, read by the UI's stale-status
resolver on a real instance (no Spark: the follower's reports are recorded as it
records them, the changelog's materializations by a stand-in asset with its key)."""

from __future__ import annotations

import dagster as dg
from dagster._core.definitions.assets.graph.asset_graph import AssetGraph
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
from dagster._core.loader import LoadingContextForTest

from binlog_assets.orchestration.partitions import (
    CHANGELOG_ASSET_KEY,
    KAFKA_PARTITIONS_NAME,
    kafka_partitions_def,
)
from binlog_assets.orchestration.replica_versions import InSync, changelog_cursor

ORDERS = dg.AssetKey(["replica", "orders"])


def _consumed(instance: dg.DagsterInstance, partition: str, version: int) -> int:
    """A consumer run's materialization of `partition` that wrote changelog `version`;
    its storage id."""
    @dg.asset(key=CHANGELOG_ASSET_KEY, partitions_def=kafka_partitions_def)
    def changelog() -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"changelog_version": version})

    assert dg.materialize([changelog], partition_key=partition, instance=instance).success
    return instance.fetch_materializations(CHANGELOG_ASSET_KEY, limit=1).records[0].storage_id


def _status(instance: dg.DagsterInstance) -> StaleStatus:
    @dg.asset(key=CHANGELOG_ASSET_KEY, partitions_def=kafka_partitions_def)
    def changelog() -> None: ...

    @dg.asset(key=ORDERS, deps=[CHANGELOG_ASSET_KEY])
    def replica() -> None: ...

    graph = AssetGraph.from_assets([changelog, replica])
    return CachingStaleStatusResolver(instance, graph, LoadingContextForTest(instance)
                                      ).get_status(ORDERS)


def test_a_replica_is_unsynced_only_while_behind_its_tables() -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, ["orders:0", "products:0"])
        _consumed(instance, "orders:0", 1)
        _consumed(instance, "products:0", 2)

        # As the follower reported before: no provenance, so any changelog partition
        # materialized later (products, here) made orders Unsynced.
        instance.report_runless_asset_event(dg.AssetMaterialization(ORDERS))
        assert _status(instance) == StaleStatus.FRESH
        _consumed(instance, "products:0", 3)
        assert _status(instance) == StaleStatus.STALE

        sync = InSync(instance, every=0)
        rows = {"dagster/row_count": dg.MetadataValue.int(7)}
        tags, _ = sync.applied("orders", 3, now=0, metadata=rows)
        instance.report_runless_asset_event(dg.AssetMaterialization(ORDERS, tags=tags))
        assert _status(instance) == StaleStatus.FRESH
        # products changed again; the follower found nothing of orders in version 4.
        _consumed(instance, "products:0", 4)
        assert _status(instance) == StaleStatus.STALE
        (in_sync,) = sync.due(["orders"], 4, now=1)
        instance.report_runless_asset_event(in_sync)
        assert _status(instance) == StaleStatus.FRESH
        assert in_sync.tags["dagster/data_version"] == tags["dagster/data_version"]
        # The apply's metadata still shows on the latest materialization.
        assert in_sync.metadata["dagster/row_count"].value == 7
        assert in_sync.metadata["in_sync_with_changelog_version"].value == 4
        assert sync.due(["orders"], 4, now=2) == []  # nothing new since

        # A consumer run wrote version 6 of orders; the follower is at 5: behind, and
        # its in-sync report at 5 leaves the cursor before that run's materialization.
        behind = _consumed(instance, "orders:0", 6)
        _consumed(instance, "products:0", 5)
        assert changelog_cursor(instance, 5) == behind - 1
        for report in sync.due(["orders"], 5, now=3):
            instance.report_runless_asset_event(report)
        assert _status(instance) == StaleStatus.STALE
        tags, cursor = sync.applied("orders", 6, now=4)
        instance.report_runless_asset_event(dg.AssetMaterialization(ORDERS, tags=tags))
        assert cursor > behind and _status(instance) == StaleStatus.FRESH


def test_the_cursor_before_any_changelog_materialization_still_sees_the_first() -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, ["orders:0"])
        # The follower's run has logged its start by the time it reports.
        instance.report_runless_asset_event(dg.AssetObservation(dg.AssetKey("run_start")))
        instance.report_runless_asset_event(dg.AssetMaterialization(
            ORDERS, tags=InSync(instance, every=0).applied("orders", 0, now=0)[0]))
        _consumed(instance, "orders:0", 1)
        assert _status(instance) == StaleStatus.STALE


def test_a_rounds_applies_share_one_cursor_lookup_until_the_next_poll(monkeypatch
                                                                       ) -> None:
    from binlog_assets.orchestration import replica_versions

    lookups: list[int] = []
    looked_up = replica_versions.changelog_cursor

    def counted(instance: dg.DagsterInstance, version: int) -> int | None:
        lookups.append(version)
        return looked_up(instance, version)

    monkeypatch.setattr(replica_versions, "changelog_cursor", counted)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, ["orders:0"])
        first = _consumed(instance, "orders:0", 1)
        sync = InSync(instance, every=0)
        cursors = {sync.applied(name, 1, now=0)[1] for name in ("orders", "products")}
        assert cursors == {first} and lookups == [1]
        # A poll: the next round's applies, even at the same version, see what was
        # recorded since.
        sync.due([], 1, now=1)
        second = _consumed(instance, "orders:0", 1)
        assert sync.applied("orders", 1, now=2)[1] == second and lookups == [1, 1]
