"""Maintenance on real Spark + Delta: compaction and VACUUM leave every table's rows as
they were, and the replicas go on following the changelog afterwards."""

from __future__ import annotations

import pytest
from lake_events import MakeConfig, Partition, Source, execute_job, row

from binlog_assets.lakehouse.changelog import (
    ChangelogWriter,
    changelog_uri,
)
from binlog_assets.lakehouse.changelog_reader import changelog_version, read_survey
from binlog_assets.lakehouse.delta_log import table_location
from binlog_assets.lakehouse.maintenance import compact_changelog, compact_table, live_files
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.orchestration.maintenance import lakehouse_maintenance_job


def _rows(spark, name: str) -> list:
    return sorted(map(repr, spark.table(name).collect()))


@pytest.mark.long  # 92 s on 2 cores; the nightly job's path
def test_compaction_keeps_rows_and_replicas_follow_after_it(
        spark, make_config: MakeConfig, tmp_path) -> None:
    pipeline = make_config([{"source": "shop.orders", "replica": "orders", "history": True}])
    db = pipeline.lakehouse.database
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = Source("shop.orders")
    for i in range(1, 7):  # one small commit and one apply each: many small files
        records = [[src.insert(row(i, note=f"n{i}"))]]
        if i > 1:
            records.append(src.update(row(i - 1), row(i - 1, note=f"again {i}")))
        part.write(part.records(records))
        builder.apply("orders")
    tables = [f"{db}.orders", f"{db}.orders_history", f"{db}.orders_current"]
    before = {t: _rows(spark, t) for t in tables}
    changelog_rows = spark.read.format("delta").load(changelog_uri(pipeline)).count()
    assert live_files(changelog_uri(pipeline))[0] >= 6

    upkeep = compact_changelog(pipeline, vacuum=True)
    assert upkeep.files_before >= 6 and upkeep.files_after == 1
    assert upkeep.bytes_after > 0 and not upkeep.note
    assert spark.read.format("delta").load(changelog_uri(pipeline)).count() == changelog_rows
    for table in (("orders",), ("orders_history",)):
        location = table_location(spark, db, *table)
        files = live_files(location)[0]
        done = compact_table(spark, pipeline, (db, *table))
        assert (done.files_before, done.files_after) == (files, 1), done
        # VACUUM keeps 7 days of versions: what compaction replaced stays on disk.
        assert done.files_vacuumed == 0
    assert {t: _rows(spark, t) for t in tables} == before

    # The changelog's compaction commit carries an empty survey: the next apply plans
    # from the commits' metadata (no scan), and the replica follows new changes.
    applied = builder.applied_version("orders")
    part.write(part.records([[src.delete(row(3))], [src.insert(row(7, note="n7"))]]))
    assert read_survey(spark, pipeline, applied, changelog_version(spark, pipeline)) is not None
    builder.apply("orders")
    live = {r["id"]: r["note"] for r in spark.table(f"{db}.orders_current").collect()}
    assert live == {1: "again 2", 2: "again 3", 4: "again 5", 5: "again 6", 6: "n6",
                    7: "n7"}

    # The job records files and bytes before and after on each table's asset.
    result = execute_job(lakehouse_maintenance_job, pipeline, tmp_path)
    seen = {(o.asset_key.to_user_string(), o.metadata["table"].value): o.metadata
            for o in result.get_asset_observation_events()
            for o in [o.event_specific_data.asset_observation]}
    assert set(seen) == {("changelog", f"`{db}`.`changelog`"),
                         ("replica/orders", f"`{db}`.`orders`"),
                         ("replica/orders", f"`{db}`.`orders_history`")}
    changelog = seen["changelog", f"`{db}`.`changelog`"]
    assert changelog["files_before"].value == 2 and changelog["files_after"].value == 1
