"""The parity check on the real stack: MariaDB with a ROW binlog, Debezium into Kafka, a
consumer run into the changelog, the replica built by the replica builder; then the
check, through a read-only account, must find an exact replica equal, and name the keys
of rows edited or deleted in the replica's Delta table behind binlake's back.

Every column kind the value rules cover is in the table (unsigned integers past the
signed range, decimals, doubles, dates, DATETIME(3), TIMESTAMP(6) read in UTC, TIME
with and without a fraction, UTF-8 text, binary, JSON, ENUM), and a second table has a
composite key, so the chunks are walked and assigned by tuples.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from decimal import Decimal

import pytest

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.dev.connect import DebeziumFence
from binlog_assets.dev.demo import wait_for_debezium
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.orchestration.partitions import partition_key
from binlog_assets.parity.check import check_replica
from binlog_assets.parity.lake import replica_uri
from binlog_assets.rounds.round import consume_partition

pytestmark = pytest.mark.integration

TOPICS = ("shop.parity.items", "shop.parity.lines", "shop.parity_1.orders",
          "shop.parity_2.orders", "shop.parity.events", "shop.parity.logs")
CHECK_USER, CHECK_PASSWORD = "binlake_check", "check-pw"
SCHEMA = [
    "CREATE DATABASE IF NOT EXISTS parity",
    "CREATE DATABASE IF NOT EXISTS parity_1",
    "CREATE DATABASE IF NOT EXISTS parity_2",
    """CREATE TABLE IF NOT EXISTS parity.items (
        id INT PRIMARY KEY, name VARCHAR(50) CHARACTER SET latin1, price DECIMAL(10,2),
        weight DOUBLE, qty INT UNSIGNED, big BIGINT UNSIGNED, created DATETIME(3),
        seen TIMESTAMP(6) NULL, dur TIME(3), day DATE, payload VARBINARY(16), doc JSON,
        size ENUM('s','m','l'), note TEXT)""",
    """CREATE TABLE IF NOT EXISTS parity.lines (
        order_id INT NOT NULL, line SMALLINT NOT NULL, sku VARCHAR(20) NOT NULL,
        amount DECIMAL(12,4), PRIMARY KEY (order_id, line))""",
    # Shards with overlapping ids, gathered into one replica by a regex.
    *(f"""CREATE TABLE IF NOT EXISTS {db}.orders (
        id INT PRIMARY KEY, status VARCHAR(10) NOT NULL)""" for db in ("parity_1", "parity_2")),
    # No primary key: keyed by `key_columns: [code]`, which no index starts with.
    """CREATE TABLE IF NOT EXISTS parity.events (
        code VARCHAR(20) NOT NULL, qty INT NOT NULL)""",
    # No key at all: its replica is the log of its changes, replayed by the check.
    """CREATE TABLE IF NOT EXISTS parity.logs (
        level VARCHAR(10) NOT NULL, msg VARCHAR(50) NOT NULL, n INT, at DATETIME(6))""",
]


def _workload(conn) -> None:
    t0 = datetime(2026, 11, 1, 9, 0, 0)
    with conn.cursor() as cur:
        for stmt in SCHEMA:
            cur.execute(stmt)
        cur.execute("SET SESSION time_zone = '+02:00'")  # TIMESTAMPs still compare in UTC
        for i in range(1, 121):
            cur.execute(
                "INSERT INTO parity.items VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                "%s, %s, %s)",
                (i, f"Ítem {i}" if i % 3 else None, Decimal(i * 101) / 100,
                 None if i % 7 == 0 else i / 3, 4294967295 - i, 18446744073709551615 - i,
                 t0 + timedelta(seconds=i, milliseconds=i), t0 + timedelta(hours=i),
                 f"-{i}:30:00.5" if i % 2 else f"{i}:00:00", t0.date() + timedelta(days=i),
                 bytes([i, 0, 255]), f'{{"n": {i}, "tags": ["a", "b"]}}',
                 "sml"[i % 3], "x" * (i % 5)))
        cur.execute("UPDATE parity.items SET name = 'renamed', weight = 1e20 WHERE id % 10 = 0")
        cur.execute("DELETE FROM parity.items WHERE id IN (5, 6, 7)")
        for order in range(1, 31):
            for line in range(1, 4):
                cur.execute("INSERT INTO parity.lines VALUES (%s, %s, %s, %s)",
                            (order, line, f"sku-{order}-{line}", Decimal(order * line) / 7))
        cur.execute("DELETE FROM parity.lines WHERE order_id = 3 AND line = 2")
        for db, n in (("parity_1", 40), ("parity_2", 30)):
            for i in range(1, n + 1):
                cur.execute(f"INSERT INTO {db}.orders VALUES (%s, %s)", (i, f"new-{db[-1]}"))
        cur.execute("UPDATE parity_2.orders SET status = 'paid' WHERE id < 10")
        for i in range(1, 21):
            cur.execute("INSERT INTO parity.events VALUES (%s, %s)", (f"ev-{i:02d}", i))
        cur.execute("UPDATE parity.events SET qty = qty * 10 WHERE code = 'ev-05'")
        cur.execute("DELETE FROM parity.events WHERE code = 'ev-07'")
        rows = [("info", "start", 1), ("info", "start", 1), ("warn", "slow", 2),
                ("info", "tick", 3), ("error", "boom", None)]
        for level, msg, n in rows:
            cur.execute("INSERT INTO parity.logs VALUES (%s, %s, %s, %s)",
                        (level, msg, n, t0 + timedelta(microseconds=7)))
        cur.execute("TRUNCATE TABLE parity.logs")
        for level, msg, n in rows:  # two equal rows: a multiset keeps both
            cur.execute("INSERT INTO parity.logs VALUES (%s, %s, %s, %s)",
                        (level, msg, n, t0 + timedelta(microseconds=7)))
        cur.execute("UPDATE parity.logs SET n = 7, at = NULL WHERE level = 'info'")
        cur.execute("DELETE FROM parity.logs WHERE level = 'info' LIMIT 1")
        # The check's account: read-only, as the README's grants say.
        cur.execute("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s",
                    (CHECK_USER, CHECK_PASSWORD))
        for db in ("parity", "parity_1", "parity_2"):
            cur.execute(f"GRANT SELECT ON {db}.* TO %s@'%%'", (CHECK_USER,))
        cur.execute("GRANT BINLOG MONITOR ON *.* TO %s@'%%'", (CHECK_USER,))


def _config(base: PipelineConfig, port: int) -> PipelineConfig:
    data = base.model_dump(mode="json", exclude_none=True)
    suffix = uuid.uuid4().hex[:6]
    data["kafka"]["group.id"] = f"parity-{suffix}"
    data["lakehouse"] = {**data["lakehouse"], "database": f"parity_{suffix}"}
    data["parity"] = {"chunk_rows": 25, "wait_seconds": 60}
    data["sources"] = [{
        "name": "parity", "topics": list(TOPICS), "format": "debezium",
        "connection": {"host": "127.0.0.1", "port": port, "user": CHECK_USER,
                       "password": CHECK_PASSWORD},
        "tables": [{"source": "parity.items", "replica": "items"},
                   {"source": "parity.lines", "replica": "lines"},
                   {"source": r"parity_\d+\.orders", "replica": "orders"},
                   {"source": "parity.events", "replica": "events",
                    "key_columns": ["code"]},
                   {"source": "parity.logs", "replica": "logs"}]}]
    return parse_config(data)


@pytest.fixture(scope="module")
def built(debezium_fence: DebeziumFence, mariadb: MariaDBServer,
          pipeline_config: PipelineConfig, spark) -> PipelineConfig:
    pipeline = _config(pipeline_config, mariadb.port)
    conn = mariadb.connect()
    _workload(conn)
    kafka_conf = dict(pipeline.kafka)
    wait_for_debezium(kafka_conf, list(TOPICS), fence=debezium_fence)
    for topic in TOPICS:
        consume_partition(pipeline, kafka_conf, partition_key(topic, 0), ChangelogRunConfig(),
                          HandlerRegistry(), group=pipeline.kafka["group.id"])
    builder = ReplicaBuilder(spark, pipeline)
    for name in ("items", "lines", "orders", "events", "logs"):
        builder.apply(name)
    return pipeline


def _check(pipeline: PipelineConfig, replica: str):
    return check_replica(pipeline, replica, dict(pipeline.kafka), pipeline.kafka["group.id"])


def test_an_exact_replica_checks_equal(built: PipelineConfig) -> None:
    for replica, rows, chunks in (("items", 117, 5), ("lines", 89, 4), ("orders", 70, 2 + 2)):
        report = _check(built, replica)
        assert report.passed, (report.summary(), report.mismatches)
        assert report.source_rows == report.replica_rows == rows
        assert report.chunks == chunks  # walked by the key, the last one open
        assert report.mismatches == [] and report.rechecked == 0
        assert report.skipped_columns == {} and report.single_chunk_tables == []
        # An idle source: known past the snapshot from the binlog between.
        assert "holds no change of the replica's tables" in report.progress, report.progress
    report = _check(built, "orders")
    assert report.tables == ["parity_1.orders", "parity_2.orders"]  # shard by shard


def test_a_key_columns_replica_without_an_index_is_one_chunk(built: PipelineConfig) -> None:
    report = _check(built, "events")
    assert report.passed, (report.summary(), report.mismatches)
    assert report.source_rows == report.replica_rows == 19
    assert report.chunks == 1 and report.single_chunk_tables == ["parity.events"]


def test_a_keyless_table_checks_equal_to_its_log_replayed(built: PipelineConfig) -> None:
    report = _check(built, "logs")
    assert report.passed, (report.summary(), report.mismatches)
    # 5 inserted, truncated, 5 again, 3 updated, 1 deleted: 4 rows, 2 of them equal.
    assert report.source_rows == report.replica_rows == 4
    assert report.chunks == 1


def test_a_row_changed_between_the_two_reads_is_checked_again_not_reported(
        built: PipelineConfig, mariadb: MariaDBServer, debezium_fence: DebeziumFence,
        spark) -> None:
    """The source changes after its chunks were summed and the replica applies the change
    before it is read: the chunk differs once, is taken again, and agrees."""
    changed = []

    def change_after_the_source_side(line: str) -> None:
        if changed or "source chunks" not in line:
            return
        with mariadb.connect().cursor() as cur:
            cur.execute("UPDATE parity.items SET note = 'changed meanwhile' WHERE id = 40")
        _catch_up(built, debezium_fence, spark, "items")
        changed.append(line)

    report = check_replica(built, "items", dict(built.kafka), built.kafka["group.id"],
                           log=change_after_the_source_side)
    assert changed
    assert report.passed, (report.summary(), report.mismatches)
    assert report.rechecked == 1  # (28, 53] differed once: the replica was newer


def _catch_up(pipeline: PipelineConfig, fence: DebeziumFence, spark, replica: str) -> None:
    kafka_conf = dict(pipeline.kafka)
    wait_for_debezium(kafka_conf, list(TOPICS), fence=fence)
    for topic in TOPICS:
        consume_partition(pipeline, kafka_conf, partition_key(topic, 0), ChangelogRunConfig(),
                          HandlerRegistry(), group=pipeline.kafka["group.id"])
    ReplicaBuilder(spark, pipeline).apply(replica)


def test_rows_edited_in_the_delta_table_are_found_and_named_by_key(
        built: PipelineConfig) -> None:
    from deltalake import DeltaTable

    items = DeltaTable(replica_uri(built, "items"))
    items.update(predicate="id = 17", updates={"price": "cast(999.99 as decimal(10,2))"})
    items.delete("id = 64")
    lines = DeltaTable(replica_uri(built, "lines"))
    lines.update(predicate="order_id = 20 AND line = 3", updates={"sku": "'tampered'"})

    report = _check(built, "items")
    assert not report.passed
    assert [(m.key_range, m.keys) for m in report.mismatches] == [
        ("(-inf, 28]", ["17: differs"]), ("(53, 78]", ["64: missing in replica"])]
    assert report.source_rows == 117 and report.replica_rows == 116
    assert report.rechecked == 2
    assert report.sample_keys(10) == ["parity.items 17: differs",
                                      "parity.items 64: missing in replica"]
    report = _check(built, "lines")
    assert [m.keys for m in report.mismatches] == [["(20, 3): differs"]]
    # A shard's row: named with its shard, the other shard's equal id left alone.
    DeltaTable(replica_uri(built, "orders")).delete("_source_db = 'parity_2' AND id = 12")
    report = _check(built, "orders")
    assert report.sample_keys(10) == ["parity_2.orders 12: missing in replica"]
    DeltaTable(replica_uri(built, "events")).update(predicate="code = 'ev-05'",
                                                    updates={"qty": "1"})
    assert _check(built, "events").sample_keys(10) == ["parity.events ev-05: differs"]
    # The log loses its delete: the deleted row is back in the replay.
    DeltaTable(replica_uri(built, "logs")).delete("_op = 'd'")
    report = _check(built, "logs")
    assert not report.passed and report.replica_rows == 5
    assert report.sample_keys(10) == ["parity.logs 1 replayed row(s) not in the source"]


def test_the_parity_job_reports_an_error_check_naming_the_keys(
        built: PipelineConfig, tmp_path) -> None:
    """After the edits above: the launchpad's choice of replicas, through Dagster."""
    import dagster as dg
    import yaml

    from binlog_assets.orchestration.parity_checks import (
        PARITY_JOB_NAME,
        build_parity_checks,
        parity_job,
    )
    from binlog_assets.orchestration.replica_assets import build_replica_assets
    from binlog_assets.orchestration.resources import BinlakeResource

    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(built.model_dump(mode="json", exclude_none=True)))
    defs = dg.Definitions(assets=[build_replica_assets(built)],
                          asset_checks=build_parity_checks(built), jobs=[parity_job(built)],
                          resources={"binlake": BinlakeResource(config_path=str(path))})
    result = defs.resolve_job_def(PARITY_JOB_NAME).execute_in_process(run_config={
        "ops": {"parity_checks": {"config": {"replicas": ["items"]}}}})
    assert result.success
    evaluations = result.get_asset_check_evaluations()
    assert [e.asset_key.path for e in evaluations] == [["replica", "items"]]  # chosen only
    (evaluation,) = evaluations
    assert not evaluation.passed
    assert evaluation.severity == dg.AssetCheckSeverity.ERROR
    md = evaluation.metadata
    assert md["differing_keys"].value == ["parity.items 17: differs",
                                          "parity.items 64: missing in replica"]
    assert md["mismatched_chunks"].value == 2 and md["chunks"].value == 5


def test_a_resync_repairs_the_ranges_and_later_streamed_changes_still_win(
        built: PipelineConfig, mariadb: MariaDBServer, debezium_fence: DebeziumFence,
        spark, tmp_path) -> None:
    """After the edits above: the named ranges re-synced at their snapshot's position
    (rows replaced, a missing row back, a row the source lacks deleted), the check then
    passes; a change streamed after the re-sync still reaches the replica."""
    import dagster as dg
    import pyarrow as pa
    import pyarrow.compute as pc
    import yaml
    from deltalake import DeltaTable, write_deltalake

    from binlog_assets.orchestration.resources import BinlakeResource
    from binlog_assets.orchestration.resync_job import resync_replica_job
    from binlog_assets.parity.chunks import KeyRange
    from binlog_assets.parity.resync import resync_table
    from binlog_assets.parity.source import connect, source_tables

    uri = replica_uri(built, "items")
    # A row the source never had, as an old change would have left it.
    rows = DeltaTable(uri).to_pyarrow_table()
    extra = rows.filter(pc.equal(rows.column("id"), 18))
    # (6 was deleted at the source long ago: the replica holds its tombstone too.)
    extra = extra.set_column(extra.schema.get_field_index("id"), "id",
                             pa.array([6], pa.int32()))
    write_deltalake(uri, extra.cast(rows.schema), mode="append")
    report = _check(built, "items")
    assert "parity.items 6: extra in replica" in report.sample_keys(10)

    db = connect(built.sources[0].connection)
    items = [t for t in source_tables(db, _route(built, "items"))][0]
    done = resync_table(built, "items", db, items, KeyRange(None, (28,)))
    assert (done[0].source_rows, done[0].deleted) == (25, 1)  # 17 replaced, 6 deleted
    resync_table(built, "items", db, items, KeyRange((53,), (78,)))  # 64 back
    db.close()
    # The re-synced rows are in the changelog; the replica has them once applied. (Not
    # yet: a check that waits a second for the apply says so, and fails.)
    waited = _check(built.model_copy(update={"parity": built.parity.model_copy(
        update={"wait_seconds": 1.0})}), "items")
    assert not waited.passed and "has not applied changelog versions" in waited.progress, \
        waited.progress
    ReplicaBuilder(spark, built).apply("items")
    assert _check(built, "items").passed

    # The job from the launchpad: every other damaged replica, whole tables.
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(built.model_dump(mode="json", exclude_none=True)))
    defs = dg.Definitions(jobs=[resync_replica_job],
                          resources={"binlake": BinlakeResource(config_path=str(path))})
    for replica in ("lines", "orders", "events"):
        result = defs.resolve_job_def("resync_replica_job").execute_in_process(
            run_config={"ops": {"resync_replica": {"config": {"replica": replica}}}})
        assert result.success
        assert _check(built, replica).passed, replica
        (count,) = result.get_asset_check_evaluations()  # the job applied and counted
        assert count.check_name == "row_count_matches_changelog" and count.passed, replica

    # Streaming goes on: a change after the re-sync's position wins over its rows.
    with mariadb.connect().cursor() as cur:
        cur.execute("UPDATE parity.items SET note = 'after the resync' WHERE id = 17")
    _catch_up(built, debezium_fence, spark, "items")
    notes = DeltaTable(uri).to_pyarrow_table().filter(pc.equal(pc.field("id"), 17))
    assert notes.column("note").to_pylist() == ["after the resync"]
    assert _check(built, "items").passed


def _route(pipeline: PipelineConfig, replica: str):
    from binlog_assets.lakehouse.replica.routes import replica_route

    return replica_route(pipeline, replica)


def test_rows_the_stream_never_carried_are_resynced_through_the_changelog(
        built: PipelineConfig, mariadb: MariaDBServer, spark) -> None:
    """Rows deleted and inserted at the source with the binlog off, as a dropped partition
    or a manual fix-up leaves them: the re-sync writes its rows to the changelog, so the
    replica and the changelog agree on its live rows once applied."""
    from binlog_assets.orchestration.replica_reports import counted_rows, row_count_check
    from binlog_assets.parity.resync import resync_table
    from binlog_assets.parity.source import connect, source_tables

    with mariadb.connect().cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute("SELECT COUNT(*) FROM parity.lines")
        (before,) = cur.fetchone()
        cur.execute("DELETE FROM parity.lines WHERE order_id = 30")
        cur.execute("INSERT INTO parity.lines VALUES (31, 1, 'sku-31-1', 1.5)")
    report = _check(built, "lines")
    assert report.sample_keys(10) == ["parity.lines (30, 1): extra in replica",
                                      "parity.lines (30, 2): extra in replica",
                                      "parity.lines (30, 3): extra in replica",
                                      "parity.lines (31, 1): missing in replica"]

    db = connect(built.sources[0].connection)
    (lines,) = source_tables(db, _route(built, "lines"))
    done = resync_table(built, "lines", db, lines)
    db.close()
    assert sum(c.deleted for c in done) == 3
    builder = ReplicaBuilder(spark, built)
    result = builder.apply("lines")
    report = _check(built, "lines")
    assert report.passed and report.replica_rows == before - 3 + 1, report.summary()
    live = counted_rows(builder, "lines", result.key_rule)
    check = row_count_check(builder, "lines", result.key_rule, live, result.applied_version)
    assert live == before - 3 + 1 and check.passed, check.description
    # The repair is in the changelog: a rebuild from it keeps it.
    builder.rebuild("lines")
    report = _check(built, "lines")
    assert report.passed and report.replica_rows == before - 3 + 1, report.summary()
