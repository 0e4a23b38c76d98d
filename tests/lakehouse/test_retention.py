"""Changelog retention on real Delta tables (delta-rs writes, Spark replicas): only rows
past the cutoff that every replica applied go, the consumer checkpoints stay, and the
replicas go on following the changelog as if nothing had been removed."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from deltalake import DeltaTable
from lake_events import (
    GROUP,
    TOPIC,
    MakeConfig,
    Partition,
    Source,
    execute_job,
    live_rows,
    row,
)

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.lakehouse.changelog import (
    ChangelogWriter,
    changelog_uri,
)
from binlog_assets.lakehouse.changelog_reader import changelog_version, read_survey
from binlog_assets.lakehouse.delta_log import added_rows
from binlog_assets.lakehouse.maintenance import compact_changelog
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.lakehouse.retention import applied_by_every_replica, retain_changelog
from binlog_assets.lakehouse.transactions import changelog_app_id
from binlog_assets.orchestration.maintenance import lakehouse_maintenance_job
from binlog_assets.orchestration.replica_reports import row_count_check


def _with_retention(pipeline: PipelineConfig, days: int = 1) -> PipelineConfig:
    data = pipeline.model_dump(mode="json", exclude_none=True)
    data["lakehouse"]["changelog_retention_days"] = days
    return parse_config(data)


def _offsets(pipeline: PipelineConfig) -> list[int]:
    table = DeltaTable(changelog_uri(pipeline)).to_pyarrow_table(columns=["offset"])
    return sorted(table.column("offset").to_pylist())


def _live(spark, pipeline: PipelineConfig, replica: str) -> dict[int, str]:
    return {r["id"]: r["note"] for r in live_rows(spark, pipeline, replica)}


def _old_mark() -> datetime:
    """A moment between two changelog commits: rows written before it are 'old' to a
    retention run at this moment plus its days."""
    time.sleep(0.02)
    mark = datetime.now(UTC)
    time.sleep(0.02)
    return mark


def test_retention_removes_only_rows_every_replica_applied(
        spark, make_config: MakeConfig) -> None:
    # Tombstones purged at once: a removed insert that came back to a replica would
    # bring its deleted row back to life.
    pipeline = _with_retention(make_config(
        [{"source": "shop.orders", "replica": "orders", "history": True},
         {"source": "shop.customers", "replica": "customers"}],
        retention_hours=1e-4))
    db = pipeline.lakehouse.database
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    orders, customers = Source("shop.orders"), Source("shop.customers")

    part.write(part.records([[orders.insert(row(1))], [orders.insert(row(2))],
                             [customers.insert(row(1, note="c1"))]]))  # offsets 0-2
    builder.apply("orders")
    builder.apply("customers")
    part.write(part.records([orders.update(row(1), row(1, note="u1")),
                             [orders.delete(row(2))],
                             [customers.insert(row(2, note="c2"))]]))  # offsets 3-5
    builder.apply("orders")  # customers stays behind, at the first commit
    mark = _old_mark()
    part.write(part.records([[orders.insert(row(3, note="n3"))],
                             customers.update(row(1, note="c1"), row(1, note="c1b"))]))  # 6-7
    builder.apply("orders")
    time.sleep(0.5)  # past the tombstone window

    # Everything but offsets 6-7 is old; customers applied only the first commit's.
    applied, waiting = applied_by_every_replica(builder, changelog_version(spark, pipeline))
    assert waiting == [] and applied == builder.applied_version("customers")
    app_id = changelog_app_id(GROUP, TOPIC, 0)
    kept = retain_changelog(pipeline, applied, now=mark + timedelta(days=1))
    assert (kept.rows_removed, kept.files_removed, kept.files_rewritten) == (3, 1, 0), kept
    assert _offsets(pipeline) == [3, 4, 5, 6, 7]
    assert DeltaTable(changelog_uri(pipeline)).transaction_version(app_id) == 8

    # The replica behind gets what it had not applied, and nothing comes back to the other.
    builder.apply("customers")
    assert _live(spark, pipeline, "customers") == {1: "c1b", 2: "c2"}
    part.write(part.records([[orders.insert(row(4, note="n4"))]]))  # offset 8
    builder.apply("orders")
    builder.apply("customers")
    assert _live(spark, pipeline, "orders") == {1: "u1", 3: "n3", 4: "n4"}

    # Compaction mixes the old rows (3-5) with young ones (6-8) in one file; once every
    # replica applied past it (a replica with no new row keeps its applied version),
    # retention rewrites that file with its young rows.
    compact_changelog(pipeline, vacuum=False)
    part.write(part.records([[orders.insert(row(5, note="n5"))],
                             [customers.insert(row(3, note="c3"))]]))  # offsets 9-10
    builder.apply("orders")
    builder.apply("customers")
    replicas = ("orders", "orders_history", "customers")
    before = {t: sorted(map(repr, spark.table(f"{db}.{t}").drop("_applied_at").collect()))
              for t in replicas}
    applied, _ = applied_by_every_replica(builder, changelog_version(spark, pipeline))
    retention_version = changelog_version(spark, pipeline) + 1
    kept = retain_changelog(pipeline, applied, now=mark + timedelta(days=1))
    assert (kept.rows_removed, kept.files_removed, kept.files_rewritten) == (3, 0, 1), kept
    assert kept.files_after == kept.files_before  # one file rewritten, the young one kept
    assert _offsets(pipeline) == [6, 7, 8, 9, 10]

    # The change feed sees no row in the retention commit, its survey is empty, and the
    # checkpoint survives a Delta checkpoint of the log too.
    assert added_rows(spark, db, "changelog", retention_version, retention_version).count() == 0
    assert read_survey(spark, pipeline, retention_version - 1, retention_version) == []
    table = DeltaTable(changelog_uri(pipeline))
    table.create_checkpoint()
    assert DeltaTable(changelog_uri(pipeline)).transaction_version(app_id) == 11

    # Replicas apply across the retention commit: only the new change lands, nothing
    # removed or rewritten comes back (key 2's tombstone is gone, its insert too).
    part.write(part.records([orders.update(row(3, note="n3"), row(3, note="n3b"))]))
    assert builder.apply("orders").rows == 1
    assert builder.apply("customers").skipped is False
    after = {t: sorted(map(repr, spark.table(f"{db}.{t}").drop("_applied_at").collect()))
             for t in replicas}
    assert after["customers"] == before["customers"]
    assert _live(spark, pipeline, "orders") == {1: "u1", 3: "n3b", 4: "n4", 5: "n5"}
    assert len(after["orders_history"]) == len(before["orders_history"]) + 1

    # Key 1's every change is gone from the changelog, not from the replica: with
    # retention on, the row-count check asks the replica for at least the changelog's keys.
    check = row_count_check(builder, "orders", "primary_key", 4,
                            builder.applied_version("orders"))
    assert check.passed and check.metadata["changelog_live_keys"].value == 3


def test_a_replica_that_applied_nothing_holds_retention_back(
        spark, make_config: MakeConfig, tmp_path) -> None:
    pipeline = _with_retention(make_config(
        [{"source": "shop.orders", "replica": "orders"},
         {"source": "shop.customers", "replica": "customers"}]))
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    orders = Source("shop.orders")
    part.write(part.records([[orders.insert(row(1))], [orders.insert(row(2))]]))
    builder.apply("orders")  # customers has no table: no row of its source came yet

    applied, waiting = applied_by_every_replica(builder, changelog_version(spark, pipeline))
    assert applied is None and waiting == [f"`{pipeline.lakehouse.database}`.`customers`"]
    kept = retain_changelog(pipeline, applied, now=datetime.now(UTC) + timedelta(days=30))
    assert kept.rows_removed == 0 and _offsets(pipeline) == [0, 1]

    # The job reports what retention did (here: nothing, and why) on the changelog.
    result = execute_job(lakehouse_maintenance_job, pipeline, tmp_path)
    retention = [o.metadata for e in result.get_asset_observation_events()
                 for o in [e.event_specific_data.asset_observation]
                 if "step" in o.metadata]
    assert len(retention) == 1
    md = retention[0]
    assert md["rows_removed"].value == 0 and md["files_removed"].value == 0
    assert md["files_before"].value == 1 and md["applied_version"].value == -1
    assert "customers" in md["note"].value
