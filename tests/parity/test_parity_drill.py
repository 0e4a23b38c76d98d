"""The parity drill on the real stack: damage a replica in the ways the stream cannot
see, and the check must find each one and name the keys, the re-sync must repair it,
and the check must then pass; and under a running workload the check raises no false
alarm across `RUNS` runs.

The damages: rows edited in the Delta table (tests/parity/test_parity_integration.py),
a changelog commit's rows deleted before an apply (its append-only guard turned off
first: Delta refuses the delete otherwise; the apply still reads them from the change
feed, a rebuild then loses them), a range of Kafka offsets skipped by the
consumer, and `ALTER TABLE … TRUNCATE PARTITION` and `DROP PARTITION` at the source
(rows removed with no row events).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from decimal import Decimal

import pytest

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.dev.connect import DebeziumFence
from binlog_assets.dev.demo import wait_for_debezium
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.lakehouse.replica.routes import replica_route
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.orchestration.partitions import partition_key
from binlog_assets.orchestration.replica_reports import counted_rows, row_count_check
from binlog_assets.parity.check import check_replica
from binlog_assets.parity.resync import resync_table
from binlog_assets.parity.source import connect, source_tables
from binlog_assets.rounds.round import consume_partition

pytestmark = [pytest.mark.integration, pytest.mark.long]

RUNS = 20
TOPICS = ("shop.drill.acc", "shop.drill.part")
USER, PASSWORD = "binlake_drill", "drill-pw"
SCHEMA = [
    "CREATE DATABASE IF NOT EXISTS drill",
    """CREATE TABLE IF NOT EXISTS drill.acc (
        id INT PRIMARY KEY, balance DECIMAL(12,2) NOT NULL, note VARCHAR(40))""",
    """CREATE TABLE IF NOT EXISTS drill.part (id INT PRIMARY KEY, v INT NOT NULL)
        PARTITION BY RANGE (id) (PARTITION p0 VALUES LESS THAN (100),
        PARTITION p1 VALUES LESS THAN (200), PARTITION pmax VALUES LESS THAN MAXVALUE)""",
]


@pytest.fixture(scope="module")
def drill(debezium_fence: DebeziumFence, mariadb: MariaDBServer,
          pipeline_config: PipelineConfig, spark) -> PipelineConfig:
    data = pipeline_config.model_dump(mode="json", exclude_none=True)
    suffix = uuid.uuid4().hex[:6]
    data["kafka"]["group.id"] = f"drill-{suffix}"
    data["lakehouse"] = {**data["lakehouse"], "database": f"drill_{suffix}"}
    data["parity"] = {"chunk_rows": 50, "wait_seconds": 120}
    data["sources"] = [{
        "name": "drill", "topics": list(TOPICS), "format": "debezium",
        "connection": {"host": "127.0.0.1", "port": mariadb.port, "user": USER,
                       "password": PASSWORD},
        "tables": [{"source": "drill.acc", "replica": "acc"},
                   {"source": "drill.part", "replica": "part"}]}]
    pipeline = parse_config(data)
    with mariadb.connect().cursor() as cur:
        for stmt in SCHEMA:
            cur.execute(stmt)
        for i in range(1, 201):
            cur.execute("INSERT INTO drill.acc VALUES (%s, %s, %s)",
                        (i, Decimal(i) * 10, f"acc {i}"))
        for i in range(1, 301):
            cur.execute("INSERT INTO drill.part VALUES (%s, %s)", (i, i))
        cur.execute("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s", (USER, PASSWORD))
        cur.execute("GRANT SELECT ON drill.* TO %s@'%%'", (USER,))
        cur.execute("GRANT BINLOG MONITOR ON *.* TO %s@'%%'", (USER,))
    _consume(pipeline, debezium_fence)
    _apply(pipeline, spark)
    return pipeline


def _consume(pipeline: PipelineConfig, fence: DebeziumFence,
             start: dict[str, int] | None = None) -> None:
    kafka_conf = dict(pipeline.kafka)
    wait_for_debezium(kafka_conf, list(TOPICS), fence=fence)
    for topic in TOPICS:
        run = ChangelogRunConfig(start_offset=(start or {}).get(topic))
        consume_partition(pipeline, kafka_conf, partition_key(topic, 0), run, HandlerRegistry(),
                          group=pipeline.kafka["group.id"])


def _apply(pipeline: PipelineConfig, spark) -> None:
    builder = ReplicaBuilder(spark, pipeline)
    for name in ("acc", "part"):
        builder.apply(name)


def _check(pipeline: PipelineConfig, replica: str):
    return check_replica(pipeline, replica, dict(pipeline.kafka), pipeline.kafka["group.id"])


def _resync(pipeline: PipelineConfig, replica: str, spark) -> None:
    db = connect(pipeline.sources[0].connection)
    try:
        for table in source_tables(db, replica_route(pipeline, replica)):
            resync_table(pipeline, replica, db, table)
    finally:
        db.close()
    builder = ReplicaBuilder(spark, pipeline)
    result = builder.apply(replica)
    # The re-sync went through the changelog: its row count agrees with the repair.
    live = counted_rows(builder, replica, result.key_rule)
    check = row_count_check(builder, replica, result.key_rule, live, result.applied_version)
    assert check.passed, check.description


def _end_offset(pipeline: PipelineConfig, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**pipeline.kafka, "group.id": "drill-ends"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
    finally:
        consumer.close()


def _found_then_repaired(pipeline: PipelineConfig, replica: str, keys: list[str],
                         spark) -> None:
    report = _check(pipeline, replica)
    assert not report.passed, report.summary()
    assert report.sample_keys(100) == keys, report.summary()
    _resync(pipeline, replica, spark)
    report = _check(pipeline, replica)
    assert report.passed, (report.summary(), report.mismatches)


def test_an_undamaged_replica_checks_equal(drill: PipelineConfig) -> None:
    for replica, rows in (("acc", 200), ("part", 300)):
        report = _check(drill, replica)
        assert report.passed and report.source_rows == rows, report.summary()


def test_skipped_kafka_offsets_are_found_and_repaired(drill: PipelineConfig, mariadb,
                                                     debezium_fence, spark) -> None:
    skip_from = _end_offset(drill, "shop.drill.acc")
    with mariadb.connect().cursor() as cur:
        for i in range(1, 11):  # one record each; the first five are skipped
            cur.execute("UPDATE drill.acc SET note = 'moved' WHERE id = %s", (i,))
    time.sleep(2)
    _consume(drill, debezium_fence, start={"shop.drill.acc": skip_from + 5})
    _apply(drill, spark)
    _found_then_repaired(drill, "acc", [f"drill.acc {i}: differs" for i in range(1, 6)],
                         spark)


def test_a_changelog_commits_rows_deleted_before_an_apply_are_found_and_repaired(
        drill: PipelineConfig, mariadb, debezium_fence, spark) -> None:
    from deltalake import DeltaTable

    from binlog_assets.lakehouse.changelog import changelog_uri
    from binlog_assets.lakehouse.delta_log import delta_rs_uri

    with mariadb.connect().cursor() as cur:
        for i in range(11, 16):
            cur.execute("UPDATE drill.acc SET note = 'lost' WHERE id = %s", (i,))
    _consume(drill, debezium_fence)
    # Someone turns the changelog's append-only guard off and deletes the commit's rows
    # before the replica applied them.
    changelog = DeltaTable(delta_rs_uri(changelog_uri(drill)))
    changelog.alter.set_table_properties({"delta.appendOnly": "false"})
    deleted = changelog.delete("`table` = 'drill.acc' AND op = 'u' AND after LIKE '%lost%'")
    changelog.alter.set_table_properties({"delta.appendOnly": "true"})
    assert deleted["num_deleted_rows"] == 5
    # An apply reads the commits it has not applied through their change feed, which
    # still holds the rows: the replica gets the updates.
    _apply(drill, spark)
    report = _check(drill, "acc")
    assert report.passed, report.summary()
    # A rebuild reads the changelog as it stands: the updates are lost.
    ReplicaBuilder(spark, drill).rebuild("acc")
    _found_then_repaired(drill, "acc", [f"drill.acc {i}: differs" for i in range(11, 16)],
                         spark)


def test_a_truncated_partition_at_the_source_is_found_and_repaired(
        drill: PipelineConfig, mariadb, debezium_fence, spark) -> None:
    with mariadb.connect().cursor() as cur:
        cur.execute("ALTER TABLE drill.part TRUNCATE PARTITION p0")  # no row events
    _consume(drill, debezium_fence)
    _apply(drill, spark)
    report = _check(drill, "part")
    assert not report.passed and report.replica_rows - report.source_rows == 99
    assert report.sample_keys(3) == [f"drill.part {i}: extra in replica" for i in (1, 2, 3)]
    _resync(drill, "part", spark)
    report = _check(drill, "part")
    assert report.passed and report.source_rows == report.replica_rows == 201


def test_a_dropped_partition_at_the_source_is_found_and_repaired(
        drill: PipelineConfig, mariadb, debezium_fence, spark) -> None:
    with mariadb.connect().cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM drill.part WHERE id >= 100 AND id < 200")
        (dropped,) = cur.fetchone()
        cur.execute("ALTER TABLE drill.part DROP PARTITION p1")  # its rows go, no row events
        cur.execute("SELECT COUNT(*) FROM drill.part")
        (left,) = cur.fetchone()
    _consume(drill, debezium_fence)
    _apply(drill, spark)
    report = _check(drill, "part")
    assert not report.passed and report.replica_rows - report.source_rows == dropped > 0
    assert report.sample_keys(2) == [f"drill.part {i}: extra in replica" for i in (100, 101)]
    _resync(drill, "part", spark)
    report = _check(drill, "part")
    assert report.passed and report.source_rows == report.replica_rows == left


def test_no_false_alarm_under_a_running_workload(drill: PipelineConfig, mariadb,
                                                spark) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        rng = random.Random(7)
        with mariadb.connect().cursor() as cur:
            while not stop.is_set():
                i = rng.randint(1, 200)
                cur.execute("UPDATE drill.acc SET balance = balance + 1, note = %s "
                            "WHERE id = %s", (f"w{rng.randint(0, 99)}", i))
                time.sleep(0.05)

    def follow() -> None:
        try:
            while not stop.is_set():
                for topic in TOPICS:
                    consume_partition(drill, dict(drill.kafka), partition_key(topic, 0),
                                      ChangelogRunConfig(), HandlerRegistry(),
                                      group=drill.kafka["group.id"])
                _apply(drill, spark)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write), threading.Thread(target=follow)]
    for t in threads:
        t.start()
    reports = []
    try:
        for _ in range(RUNS):
            reports.append(_check(drill, "acc"))
    finally:
        stop.set()
        for t in threads:
            t.join(300)
    assert not errors, errors
    alarms = [r.summary() for r in reports if not r.passed]
    assert alarms == [], alarms
    print(f"{RUNS} checks under a workload: rechecked chunks "
          f"{sum(r.rechecked for r in reports)}, seconds "
          f"{[round(r.seconds, 1) for r in reports]}")
