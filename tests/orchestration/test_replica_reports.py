"""What the replica assets report: a position as a reader knows it."""

from __future__ import annotations

from binlog_assets.lakehouse.replica import ReplicaResult
from binlog_assets.orchestration.replica_reports import position_label, replica_metadata


def test_position_label_reads_as_binlog_coordinates() -> None:
    assert position_label((1, 1, 381614, 0, 10, 0)) == "000001:381614 row 0, offset 10"
    assert position_label((0, 12, 4, 2, 7, 1)) == "snapshot, 000012:4 row 2, offset 7"


def test_schema_changes_reach_the_materialization_metadata() -> None:
    result = ReplicaResult("orders", applied_version=3, schema_changes=(
        "drop column note", "rename column a -> b (shop.orders)"))
    md = replica_metadata(result, live_rows=2)
    assert md["schema_changes"].data == ["drop column note",
                                         "rename column a -> b (shop.orders)"]
    assert "schema_changes" not in replica_metadata(ReplicaResult("orders"), None)
