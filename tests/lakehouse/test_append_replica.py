"""Replicas of tables without a primary key, on real Spark + Delta: the append-only log
(`append_replica.py`, by default or by `replica_mode: append`), `key_columns`, and how a
replica keeps its rule when the config or the source changes."""

from __future__ import annotations

from decimal import Decimal

import dagster as dg
import pytest
import yaml
from lake_events import MakeConfig, Partition, Source, row

from binlog_assets.config import parse_config
from binlog_assets.lakehouse.audit import expected_log_rows
from binlog_assets.lakehouse.changelog import ChangelogWriter, PartitionWrite
from binlog_assets.lakehouse.delta_log import open_log, table_exists, table_location
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder, ReplicaError
from binlog_assets.orchestration.replica_assets import build_replica_assets
from binlog_assets.orchestration.replica_reports import ROW_COUNT_CHECK, replica_key
from binlog_assets.orchestration.resources import BinlakeResource

LOGS = {"source": "app.logs", "replica": "logs"}


def _log(spark, pipeline, replica: str = "logs") -> list[tuple]:
    """The replica's rows as (op, position, id, amount, note), in position order."""
    rows = spark.table(f"{pipeline.lakehouse.database}.{replica}").collect()
    return sorted((tuple(r["_position"]), r["_op"], r["id"], r["amount"], r["note"])
                  for r in rows)


def _keyless() -> Source:
    return Source("app.logs", key_columns=())


# A small batch is appended by delta-rs from the driver; Spark's append and MERGE (the
# way of a batch past `arrow_commit_rows`, here 0) give the same log, in the long run.
@pytest.mark.parametrize("by", ["delta-rs", pytest.param("spark", marks=pytest.mark.long)])
def test_keyless_table_becomes_the_log_of_its_changes_each_once(
        spark, make_config: MakeConfig, by: str) -> None:
    # A tombstone window this short would purge every delete of a keyed replica.
    pipeline = make_config([LOGS], retention_hours=1e-9,
                           **({"arrow_commit_rows": 0} if by == "spark" else {}))
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = _keyless()
    a = row(1, "1.00", "a")
    events = part.records([[src.insert(a)], [src.insert(a)], src.update(a, row(1, "2.00", "b")),
                           [src.delete(row(1, "2.00", "b"))], [src.truncate()],
                           [src.insert(row(2))]])
    part.write(events)

    first = builder.apply("logs")
    assert first.key_rule == "append_only"
    assert "key_columns" in first.warning and "replica_mode: append" in first.warning
    assert (first.rows, first.written) == (6, 6)
    log = _log(spark, pipeline)
    assert [op for _, op, *_ in log] == ["c", "c", "u", "d", "t", "c"]
    # Identical rows at the source stay two changes; a delete keeps its before-image.
    assert [tuple(values) for _, _, *values in log] == [
        (1, Decimal("1.00"), "a"), (1, Decimal("1.00"), "a"), (1, Decimal("2.00"), "b"),
        (1, Decimal("2.00"), "b"), (None, None, None), (2, Decimal("1.00"), "n")]
    # No live rows without a key: no `_current` view to pretend otherwise.
    assert not table_exists(spark, pipeline.lakehouse.database, "logs_current")

    again = builder.apply("logs")
    assert again.skipped and again.key_rule == "append_only" and again.warning
    # The same changes again in bronze (a second consumer group) and, within one batch,
    # a copy re-sent at a later Kafka offset: same binlog coordinates, the same changes.
    part.writer.write(PartitionWrite(events, None, group_id="second-group", topic="binlog",
                                     partition=0, end_offset=part.end))
    resent = part.records([[events[-1]]])
    part.write([*resent, *part.records([[src.insert(row(3))]])])
    replay = builder.apply("logs")
    assert (replay.rows, replay.written) == (8, 1)
    log = open_log(table_location(spark, pipeline.lakehouse.database, "logs"))
    writers = [("clientVersion" in h and "delta-rs") or "spark"
               for h in log.history() if h["operation"] != "CREATE TABLE"]
    assert writers and set(writers) == {by}
    assert len(_log(spark, pipeline)) == 7
    assert expected_log_rows(spark, pipeline, "logs", replay.applied_version) == 7
    assert builder.apply("logs", up_to_version=first.applied_version).skipped

    before = _log(spark, pipeline)
    rebuilt = builder.rebuild("logs")
    assert rebuilt.key_rule == "append_only" and _log(spark, pipeline) == before


def test_append_mode_logs_a_keyed_table_without_a_warning(spark, make_config: MakeConfig
                                                          ) -> None:
    pipeline = make_config([{"source": "shop.orders", "replica": "orders",
                           "replica_mode": "append"}])
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = Source("shop.orders")
    part.write(part.records([[src.insert(row(1))], src.update(row(1), row(1, "3.00"))]))
    result = builder.apply("orders")
    assert (result.key_rule, result.warning, result.written) == ("append_only", None, 2)
    assert [op for _, op, *_ in _log(spark, pipeline, "orders")] == ["c", "u"]


def test_key_columns_key_a_keyless_table_like_a_primary_key(
        spark, make_config_each_path: MakeConfig) -> None:
    pipeline = make_config_each_path([{**LOGS, "key_columns": ["note"]}])
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = _keyless()
    part.write(part.records([[src.insert(row(1, "1.00", "a"))], [src.insert(row(2, "2.00", "b"))],
                             [src.insert(row(3, "3.00", "c"))]]))
    first = builder.apply("logs")
    assert (first.key_rule, first.warning) == ("key_columns", None)
    part.write(part.records([src.update(row(1, "1.00", "a"), row(1, "1.50", "a")),
                             # The configured key itself changes: `b` is gone, `z` is new.
                             src.update(row(2, "2.00", "b"), row(2, "2.00", "z")),
                             [src.delete(row(3, "3.00", "c"))]]))
    builder.apply("logs")
    live = spark.table(f"{pipeline.lakehouse.database}.logs_current").collect()
    assert {r["note"]: (r["id"], r["amount"]) for r in live} == {
        "a": (1, Decimal("1.50")), "z": (2, Decimal("2.00"))}


def test_a_replica_keeps_its_rule_and_says_how_to_change_it(
        spark, make_config: MakeConfig) -> None:
    pipeline = make_config([LOGS])
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = _keyless()
    # Truncates alone tell nothing about a key: nothing is built from them yet.
    part.write(part.records([[src.truncate()]]))
    assert builder.apply("logs").key_rule is None
    assert not table_exists(spark, pipeline.lakehouse.database, "logs")
    part.write(part.records([[src.insert(row(1))]]))
    assert builder.apply("logs").key_rule == "append_only"

    # The source gains a primary key: the log goes on, and says a rebuild would key it.
    keyed = Source("app.logs", pos=src.pos)
    part.write(part.records([[keyed.insert(row(2))]]))
    gained = builder.apply("logs")
    assert (gained.key_rule, gained.written) == ("append_only", 1)
    assert "now carry the primary key ['id']" in gained.warning

    # key_columns set afterwards: the build names the way out instead of mixing rules.
    data = pipeline.model_dump(mode="json", exclude_none=True)
    data["sources"][0]["tables"] = [{**LOGS, "key_columns": ["id"]}]
    keyed_config = parse_config(data)
    part.write(part.records([[keyed.insert(row(3))]]))
    keyed_builder = ReplicaBuilder(spark, keyed_config)
    with pytest.raises(ReplicaError, match=r"'logs' was built append-only .* key_columns "
                                           r"\['id'\]: rebuild it"):
        keyed_builder.apply("logs")
    assert keyed_builder.rebuild("logs").key_rule == "key_columns"
    live = spark.table(f"{pipeline.lakehouse.database}.logs_current").collect()
    assert sorted(r["id"] for r in live) == [1, 2, 3]


def test_asset_metadata_reports_the_rule_and_the_check_counts_changes(
        spark, make_config: MakeConfig, tmp_path) -> None:
    pipeline = make_config([LOGS])
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_none=True)))
    part, src = Partition(ChangelogWriter(pipeline)), _keyless()
    part.write(part.records([[src.insert(row(1))], [src.insert(row(1))],
                             [src.delete(row(1))]]))
    result = dg.materialize(
        [build_replica_assets(pipeline)], selection=[replica_key("logs")],
        resources={"binlake": BinlakeResource(config_path=str(path))},
        instance=dg.DagsterInstance.ephemeral())
    assert result.success
    (mat,) = result.asset_materializations_for_node("replicas")
    assert mat.metadata["key_rule"].value == "append_only"
    assert "set key_columns" in mat.metadata["warning"].value
    assert mat.metadata["rows"].value == 3
    (check,) = [e for e in result.get_asset_check_evaluations()
                if e.check_name == ROW_COUNT_CHECK]
    assert check.passed and check.metadata["changelog_live_keys"].value == 3
