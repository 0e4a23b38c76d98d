"""What the replica assets report: a position as a reader knows it."""

from __future__ import annotations

from binlog_assets.orchestration.replica_reports import position_label


def test_position_label_reads_as_binlog_coordinates() -> None:
    assert position_label((1, 1, 381614, 0, 10, 0)) == "000001:381614 row 0, offset 10"
    assert position_label((0, 12, 4, 2, 7, 1)) == "snapshot, 000012:4 row 2, offset 7"
