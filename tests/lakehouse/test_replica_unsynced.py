"""The asset graph's "Unsynced" on followed replicas: only where a replica is behind.

Against a real Dagster instance, with the stale-status resolver the UI's asset graph
uses (`CachingStaleStatusResolver`): two replicas on their own topics, a follower run,
and consumer runs' changelog materializations (a stand-in asset with the changelog's key
and partitions, materialized by Dagster as a consumer run is, with the changelog version
it wrote). A change of one table leaves the other replica current; a change the
follower has not applied leaves its replica Unsynced until a follower applies it.
"""

from __future__ import annotations

import threading
import time

import dagster as dg
import yaml
from dagster._core.definitions.assets.graph.asset_graph import AssetGraph
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
from dagster._core.loader import LoadingContextForTest
from lake_events import Partition, Source, row

from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.orchestration.changelog_asset import changelog
from binlog_assets.orchestration.dbt_follow import dbt_follow_sensor
from binlog_assets.orchestration.partitions import (
    CHANGELOG_ASSET_KEY,
    KAFKA_PARTITIONS_NAME,
    kafka_partitions_def,
)
from binlog_assets.orchestration.replica_assets import build_replica_assets
from binlog_assets.orchestration.replica_follower import follow_replicas_job
from binlog_assets.orchestration.replica_reports import replica_key
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import IN_SYNC_TAG, SPARK_POOL

NAMES = ("orders", "products")


def _consumed(instance: dg.DagsterInstance, part: Partition, events) -> None:
    """A consumer run of `part`: its changelog commit, then its materialization."""
    version = part.write(events)

    @dg.asset(key=CHANGELOG_ASSET_KEY, partitions_def=kafka_partitions_def)
    def stand_in() -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"changelog_version": version})

    assert dg.materialize([stand_in], partition_key=f"{part.topic}:0", instance=instance
                          ).success


def _statuses(instance: dg.DagsterInstance, graph) -> dict[str, StaleStatus]:
    resolver = CachingStaleStatusResolver(instance, graph, LoadingContextForTest(instance))
    return {name: resolver.get_status(replica_key(name)) for name in NAMES}


def _materializations(instance: dg.DagsterInstance, name: str, *, in_sync: bool) -> int:
    records = instance.fetch_materializations(replica_key(name), limit=100).records
    return sum((IN_SYNC_TAG in (r.event_log_entry.tags or {})) == in_sync for r in records)


def test_only_a_replica_behind_its_tables_shows_unsynced(spark, make_config, tmp_path,
                                                         monkeypatch) -> None:
    # Every in-process run starts with `logging.config.dictConfig`, which closes every
    # handler of the process under logging's lock: a consumer run started in a thread
    # while the follower run logs deadlocks the two. This test's runs need no YAML handlers.
    monkeypatch.setattr(dg.DagsterInstance, "get_yaml_python_handlers", lambda self: [])
    pipeline = make_config([{"source": "shop.orders", "replica": "orders"},
                          {"source": "shop.products", "replica": "products"}],
                         dagster={"replica_poll_seconds": 0.2})
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_none=True)))
    resources = {"binlake": BinlakeResource(config_path=str(path))}
    graph = AssetGraph.from_assets([changelog, build_replica_assets(pipeline)])
    writer = ChangelogWriter(pipeline)
    orders, products = Source("shop.orders"), Source("shop.products")
    on_orders, on_products = Partition(writer, topic="orders"), Partition(writer,
                                                                           topic="products")
    seen: dict[str, dict[str, StaleStatus]] = {}

    def follower(instance: dg.DagsterInstance, seconds: float) -> dg.ExecuteInProcessResult:
        return follow_replicas_job.execute_in_process(
            instance=instance, resources=resources,
            run_config={"ops": {"follow_replicas": {"config": {
                "seconds": seconds, "sync_seconds": 0}}}})

    def meanwhile(instance: dg.DagsterInstance) -> None:
        # A liveness bound from before the follower's Spark starts: generous, since a
        # loaded 2-core host ran this test 3-4 times slower than an idle one.
        deadline = time.monotonic() + 600

        def until(done) -> None:
            while not done() and time.monotonic() < deadline:
                time.sleep(0.2)

        until(lambda: all(_materializations(instance, n, in_sync=False) for n in NAMES))
        seen["applied"] = _statuses(instance, graph)
        # A change of products alone: the follower applies it, and orders, which has
        # nothing to apply, must not turn Unsynced for it.
        _consumed(instance, on_products, on_products.records(
            [[products.insert(row(2))]]))
        until(lambda: _materializations(instance, "products", in_sync=False) == 2
              and _statuses(instance, graph) == dict.fromkeys(NAMES, StaleStatus.FRESH))
        seen["other table changed"] = _statuses(instance, graph)
        instance.event_log_storage.claim_concurrency_slot(SPARK_POOL, "rebuild", "replicas")

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, ["orders:0", "products:0"])
        instance.event_log_storage.set_concurrency_slots(SPARK_POOL, 1)
        _consumed(instance, on_orders, on_orders.records([[orders.insert(row(1))]]))
        _consumed(instance, on_products, on_products.records([[products.insert(row(1))]]))
        assert _statuses(instance, graph) == dict.fromkeys(NAMES, StaleStatus.MISSING)

        thread = threading.Thread(target=meanwhile, args=(instance,))
        thread.start()
        assert follower(instance, 300).success
        thread.join()
        instance.event_log_storage.free_concurrency_slots_for_run("rebuild")
        assert seen["applied"] == dict.fromkeys(NAMES, StaleStatus.FRESH)
        assert seen["other table changed"] == dict.fromkeys(NAMES, StaleStatus.FRESH)
        # orders was reported in sync (same data version), not applied again.
        assert _materializations(instance, "orders", in_sync=False) == 1
        assert _materializations(instance, "orders", in_sync=True) >= 1
        orders_versions = {r.event_log_entry.tags.get("dagster/data_version") for r in
                           instance.fetch_materializations(replica_key("orders"),
                                                           limit=10).records}
        assert len(orders_versions) == 1
        # The in-sync report still shows the replica's columns on its latest materialization.
        latest = instance.fetch_materializations(replica_key("orders"), limit=1).records[0]
        assert IN_SYNC_TAG in latest.event_log_entry.tags
        assert "dagster/column_schema" in latest.asset_materialization.metadata

        # A change of orders while no follower runs: orders is behind, and says so.
        _consumed(instance, on_orders, on_orders.records([[orders.insert(row(2))]]))
        assert _statuses(instance, graph)["orders"] == StaleStatus.STALE
        # The next follower applies it (and reports products in sync): nothing is behind.
        assert follower(instance, 2).success
        assert _statuses(instance, graph) == dict.fromkeys(NAMES, StaleStatus.FRESH)
        assert _materializations(instance, "orders", in_sync=False) == 2
        # The changelog moves for a table no replica reads: both are reported in sync,
        # after orders' apply.
        _consumed(instance, on_orders, on_orders.records([[Source("shop.other").insert(row(1))]]))
        assert follower(instance, 2).success
        assert _materializations(instance, "orders", in_sync=False) == 2

        # dbt follows data changes, not in-sync reports.
        models = {dg.AssetKey("mart"): {replica_key(name) for name in NAMES}}
        tick = dbt_follow_sensor(models)(dg.build_sensor_context(instance=instance,
                                                                 resources=resources))
        latest = max(instance.fetch_materializations(replica_key(name), limit=1)
                     .records[0].storage_id for name in NAMES)
        changed = max(r.storage_id for name in NAMES for r in instance.fetch_materializations(
            replica_key(name), limit=100).records
            if IN_SYNC_TAG not in (r.event_log_entry.tags or {}))
        # An in-sync report came last; the build is for orders' apply before it.
        assert changed < latest
        assert tick.run_requests[0].run_key == f"replicas@{changed}"
