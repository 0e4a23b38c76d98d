"""The replica multi-asset, materialized for real: its metadata and its row-count check.

The check compares the replica's live rows with an independent reduction of the
changelog (`lakehouse.audit`); it passes after an honest apply and fails, naming both
counts, once a row goes missing from the replica behind binlake's back.
"""

from __future__ import annotations

import time

import dagster as dg
import pytest
import yaml
from lake_events import Partition, Source, row

from binlog_assets.config import PipelineConfig
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.orchestration.replica_assets import build_replica_assets
from binlog_assets.orchestration.replica_reports import (
    ROW_COUNT_CHECK,
    SOURCE_DELAY_CHECK,
    replica_key,
)
from binlog_assets.orchestration.resources import BinlakeResource


def _materialize(pipeline: PipelineConfig, path, *, rebuild: bool = False,
                 replicas: tuple[str, ...] = ("orders",)) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [build_replica_assets(pipeline)],
        selection=[replica_key(name) for name in replicas],
        resources={"binlake": BinlakeResource(config_path=str(path))},
        instance=dg.DagsterInstance.ephemeral(),
        run_config={"ops": {"replicas": {"config": {"rebuild": rebuild}}}},
        raise_on_error=False,
    )


def _check(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    (evaluation,) = [e for e in result.get_asset_check_evaluations()
                     if e.check_name == ROW_COUNT_CHECK]
    return evaluation


def test_row_count_check_catches_a_missing_row_and_a_rebuild_restores_it(
        spark, make_config, tmp_path) -> None:
    pipeline = make_config([{"source": r"shop_\d+\.orders", "replica": "orders"}])
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_none=True)))
    one, two = Source("shop_1.orders"), Source("shop_2.orders")
    part = Partition(ChangelogWriter(pipeline))
    records = [[one.insert(row(i))] for i in range(1, 6)]
    records += [[two.insert(row(i))] for i in range(1, 4)]  # equal ids, other shard
    records += [[one.delete(row(2))], one.update(row(3), row(30)), [two.truncate()],
                [two.insert(row(9))]]
    part_events = part.records(records)
    part.write(part_events)

    result = _materialize(pipeline, path)
    assert result.success
    (mat,) = result.asset_materializations_for_node("replicas")
    assert mat.metadata["rows"].value == 5  # shop_1: 1, 4, 5, 30; shop_2: 9
    # Dagster's standard table metadata: the live rows, and the columns as the table has
    # them (the Delta log's, read by delta-rs, typed as Spark SQL names them).
    assert mat.metadata["dagster/row_count"].value == 5
    columns = {c.name: c.type for c in mat.metadata["dagster/column_schema"].schema.columns}
    table = spark.table(f"{pipeline.lakehouse.database}.orders")
    assert columns == {f.name: f.dataType.simpleString() for f in table.schema.fields}
    docs = {c.name: c.description for c in mat.metadata["dagster/column_schema"].schema.columns}
    assert docs["_position"].startswith("binlog position") and docs["id"] is None
    check = _check(result)
    assert check.passed, check.description
    assert check.metadata["changelog_live_keys"].value == 5
    # How far behind its source: from the newest source commit applied (in 2023 here, so
    # the delay check warns).
    newest = max(e.source_ts for e in part_events)
    assert mat.metadata["last_source_commit"].value == newest / 1000
    (delay,) = [e for e in result.get_asset_check_evaluations()
                if e.check_name == SOURCE_DELAY_CHECK]
    assert not delay.passed and delay.severity == dg.AssetCheckSeverity.WARN
    assert delay.metadata["source_delay_seconds"].value == pytest.approx(
        time.time() - newest / 1000, abs=120)

    db = pipeline.lakehouse.database
    spark.sql(f"DELETE FROM {db}.orders WHERE _source_db = 'shop_1' AND id = 4")
    part.write(part.records([[two.insert(row(10))]]))
    check = _check(_materialize(pipeline, path))
    assert not check.passed
    assert check.metadata["replica_rows"].value == 5
    assert check.metadata["changelog_live_keys"].value == 6
    assert "6 live keys" in check.description

    # A full rebuild from the changelog (run config `rebuild: true`) brings the row back.
    result = _materialize(pipeline, path, rebuild=True)
    (mat,) = result.asset_materializations_for_node("replicas")
    assert mat.metadata["rows"].value == 6
    assert _check(result).passed
    ids = {(r["_source_db"], r["id"]) for r in spark.table(f"{db}.orders_current").collect()}
    assert ids == {("shop_1", 1), ("shop_1", 4), ("shop_1", 5), ("shop_1", 30),
                   ("shop_2", 9), ("shop_2", 10)}


def test_a_failing_replica_fails_the_build_after_the_others_are_reported(
        spark, make_config, tmp_path) -> None:
    """One replica's apply fails (its key column is in no row): the others of the build
    are still applied and reported, and the run fails naming the one that failed."""
    pipeline = make_config([{"source": "shop_1.orders", "replica": "orders"},
                          {"source": "shop_2.orders", "replica": "broken",
                           "key_columns": ["nope"]}])
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_none=True)))
    one, two = Source("shop_1.orders"), Source("shop_2.orders")
    part = Partition(ChangelogWriter(pipeline))
    part.write(part.records([[one.insert(row(1))], [two.insert(row(2))]]))

    result = _materialize(pipeline, path, replicas=("broken", "orders"))
    assert not result.success
    reported = {m.asset_key for m in result.asset_materializations_for_node("replicas")}
    assert reported == {replica_key("orders")}
    (failure,) = result.get_step_failure_events()
    assert "1 of 2 replicas failed: broken:" in failure.step_failure_data.error.cause.message
    assert spark.table(f"{pipeline.lakehouse.database}.orders_current").count() == 1
