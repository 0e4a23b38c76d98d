"""What the replica assets report: a position as a reader knows it."""

from __future__ import annotations

import dagster as dg

from binlog_assets.lakehouse.replica.builder import ReplicaResult
from binlog_assets.orchestration.replica_reports import (
    position_label,
    replica_metadata,
    source_delay,
    source_delay_check,
)


def test_position_label_reads_as_binlog_coordinates() -> None:
    assert position_label((1, 1, 381614, 0, 10, 0)) == "000001:381614 row 0, offset 10"
    assert position_label((0, 12, 4, 2, 7, 1)) == "snapshot, 000012:4 row 2, offset 7"
    assert position_label((1, 12, 4, -1, 7, 0)) == "snapshot, 000012:4, offset 7"
    assert position_label((3, 2, 40, 1, 9, 0)) == "lineage 3, 000002:40 row 1, offset 9"


def test_schema_changes_reach_the_materialization_metadata() -> None:
    result = ReplicaResult("orders", applied_version=3, schema_changes=(
        "drop column note", "rename column a -> b (shop.orders)"))
    md = replica_metadata(result, live_rows=2)
    assert md["schema_changes"].data == ["drop column note",
                                         "rename column a -> b (shop.orders)"]
    assert "schema_changes" not in replica_metadata(ReplicaResult("orders"), None)


def test_the_source_delay_is_reported_and_warns_past_its_limit() -> None:
    key = dg.AssetKey(["replica", "orders"])
    result = ReplicaResult("orders", applied_version=3, last_source_ts=1_000_000)
    md = replica_metadata(result, None)
    assert md["last_source_commit"].value == 1000.0
    assert md["source_delay_seconds"].value > 1_000_000_000  # 1970 is long ago
    assert source_delay(result, now=1030.5) == 30.5
    near = source_delay_check(key, result, limit=60, now=1030.5)
    far = source_delay_check(key, result, limit=10, now=1030.5)
    assert near.passed and not far.passed
    assert far.severity == dg.AssetCheckSeverity.WARN
    assert "30.5 s after its source commit (limit 10 s" in far.description
    # Nothing applied with a source time: nothing to judge, nothing in the metadata.
    for quiet in (ReplicaResult("orders"), ReplicaResult("orders", skipped=True,
                                                         last_source_ts=1_000_000)):
        assert source_delay(quiet, now=1030.5) is None
        assert "source_delay_seconds" not in replica_metadata(quiet, None)
        assert source_delay_check(key, quiet, limit=10, now=1030.5).passed
