"""Every transaction's version read from the log in one pass equals delta-rs's answer
for each id, through checkpoints, later commits and another writer's commits."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from binlog_assets.lakehouse.txn_log import AppVersions


def _commit(uri: str, txns: dict[str, int]) -> None:
    write_deltalake(uri, pa.table({"x": [1]}), mode="append",
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(k, v) for k, v in txns.items()]))


def _expected(table: DeltaTable, ids: set[str]) -> dict[str, int]:
    found = {i: table.transaction_version(i) for i in ids}
    return {i: v for i, v in found.items() if v is not None}


def test_versions_equal_delta_rs_through_checkpoints_and_other_writers(tmp_path: Path
                                                                       ) -> None:
    uri = str(tmp_path / "t")
    ids: set[str] = set()
    for v in range(6):
        txns = {f"g/t/{v % 3}": v * 10, f"g/t/{v % 3}#binlog": v}
        ids |= set(txns)
        _commit(uri, txns)
    table = DeltaTable(uri)
    reader = AppVersions(uri)
    assert reader.of(table) == _expected(table, ids) == {
        "g/t/0": 30, "g/t/0#binlog": 3, "g/t/1": 40, "g/t/1#binlog": 4, "g/t/2": 50,
        "g/t/2#binlog": 5}

    table.create_checkpoint()
    for v in range(6, 9):
        _commit(uri, {f"g/t/{v % 4}": v * 10})
        ids.add(f"g/t/{v % 4}")
    # Another writer's commits and checkpoint: this reader reads on from where it was.
    other = DeltaTable(uri)
    _commit(uri, {"g/u/0": 7})
    ids.add("g/u/0")
    other.update_incremental()
    other.create_checkpoint()
    table.update_incremental()
    assert reader.of(table) == _expected(table, ids)
    assert reader.of(table)["g/t/3"] == 70

    # A fresh reader starts from the newest checkpoint and the commits after it.
    _commit(uri, {"g/t/0": 99})
    table.update_incremental()
    fresh = AppVersions(uri)
    assert fresh.of(table) == reader.of(table) == _expected(table, ids)
    assert fresh.of(table)["g/t/0"] == 99
    # A version older than the last checkpoint: delta-rs answers; the newest reads on.
    assert reader.of(DeltaTable(uri, version=3)) is None
    assert reader.of(table) == _expected(table, ids)


def test_a_table_that_expires_transactions_is_left_to_delta_rs(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"x": [1]}), configuration={
        "delta.setTransactionRetentionDuration": "interval 1 days"})
    _commit(uri, {"a": 1})
    assert AppVersions(uri).of(DeltaTable(uri)) is None


def test_a_commit_cleaned_up_since_is_read_from_the_checkpoint(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    for v in range(3):
        _commit(uri, {"a": v})
    table = DeltaTable(uri)
    reader = AppVersions(uri)
    assert reader.of(table) == {"a": 2}
    _commit(uri, {"a": 3})
    _commit(uri, {"b": 1})
    table.update_incremental()
    table.create_checkpoint()
    (tmp_path / "t" / "_delta_log" / f"{3:020d}.json").unlink()
    assert reader.of(table) == {"a": 3, "b": 1}
