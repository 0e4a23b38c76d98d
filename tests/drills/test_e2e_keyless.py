"""End to end for tables without a primary key: MariaDB, Debezium (a null Kafka key and
no key fields), the changelog, then the replica build under each stated rule.

`keyless.events` has no key at the source but a column unique by the application:
configured with `key_columns: [code]` its replica must equal the source row for row.
`keyless.logs` has no key at all, not even unique rows, and no setting: its replica is
the append-only log of its changes, every change exactly once, however often the
changelog is replayed and the replica rebuilt. Neither may fail the build.
"""

from __future__ import annotations

import uuid
from collections import Counter

from changelog_reads import changelog_frame
from confluent_kafka import Consumer, TopicPartition

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.dev import shop
from binlog_assets.dev.connect import DebeziumFence, KafkaConnect
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.lakehouse.audit import expected_log_rows
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.orchestration.partitions import partition_key
from binlog_assets.rounds.round import consume_partition

TOPICS = ("shop.keyless.events", "shop.keyless.logs")
KEYS = tuple(partition_key(t, 0) for t in TOPICS)
# No PRIMARY KEY, and no UNIQUE index either: Debezium may key a table without a primary
# key by a unique index, and then it is not keyless (the test checks the Kafka keys).
SCHEMA = [
    "CREATE DATABASE IF NOT EXISTS keyless",
    """CREATE TABLE IF NOT EXISTS keyless.events (
        code VARCHAR(20) NOT NULL, qty INT NOT NULL, price DECIMAL(10,2), note VARCHAR(50))""",
    """CREATE TABLE IF NOT EXISTS keyless.logs (
        level VARCHAR(10) NOT NULL, msg VARCHAR(100) NOT NULL, n INT)""",
]
EVENTS: shop.Spec = (("keyless.events",), ("code", "qty", "price", "note"))
LOG_COLUMNS = ("level", "msg", "n")


def _config(base: PipelineConfig) -> PipelineConfig:
    data = base.model_dump(mode="json", exclude_none=True)
    suffix = uuid.uuid4().hex[:6]
    data["kafka"]["group.id"] = f"keyless-{suffix}"
    data["lakehouse"] = {**data["lakehouse"], "database": f"keyless_{suffix}"}
    data["sources"] = [{"name": "keyless", "topics": list(TOPICS), "format": "debezium",
                        "tables": [{"source": "keyless.events", "replica": "events",
                                    "key_columns": ["code"]},
                                   {"source": "keyless.logs", "replica": "logs"}]}]
    return parse_config(data)


def _workload(conn) -> Counter:
    """Changes to both tables; returns the changes of `keyless.logs` per op."""
    logs: Counter = Counter()
    with conn.cursor() as cur:
        for stmt in SCHEMA:
            cur.execute(stmt)
        for code, qty, price in [("a1", 1, "1.10"), ("b2", 2, "22.00"), ("c3", 3, None),
                                 ("d4", 4, "0.04"), ("e5", 5, "5.55")]:
            cur.execute("INSERT INTO keyless.events VALUES (%s, %s, %s, %s)",
                        (code, qty, price, f"note {code}"))
        cur.execute("UPDATE keyless.events SET qty = qty + 10 WHERE code IN ('a1', 'c3')")
        # The configured key itself changes: the replica must drop the old code.
        cur.execute("UPDATE keyless.events SET code = 'z9', note = NULL WHERE code = 'b2'")
        cur.execute("DELETE FROM keyless.events WHERE code = 'd4'")
        cur.execute("INSERT INTO keyless.events VALUES ('d4', 40, 4.40, 'again')")

        # Two identical rows: only a log of changes keeps them apart.
        for level, msg, n in [("info", "start", 1), ("info", "start", 1), ("warn", "slow", 2),
                              ("info", "tick", 3), ("error", "boom", None)]:
            cur.execute("INSERT INTO keyless.logs VALUES (%s, %s, %s)", (level, msg, n))
        logs["c"] += 5
        logs["u"] += cur.execute("UPDATE keyless.logs SET n = 7 WHERE level = 'info'")
        logs["d"] += cur.execute("DELETE FROM keyless.logs WHERE level = 'info' LIMIT 1")
        cur.execute("TRUNCATE TABLE keyless.logs")
        logs["t"] += 1
        cur.execute("INSERT INTO keyless.logs VALUES ('info', 'after truncate', 8)")
        logs["c"] += 1
    return logs


def _kafka_keys(kafka_conf: dict, ends: dict[str, int]) -> set:
    consumer = Consumer({**kafka_conf, "group.id": f"keys-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False})
    keys = set()
    try:
        for key, end in ends.items():
            topic, partition = key.rsplit(":", 1)
            consumer.assign([TopicPartition(topic, int(partition), 0)])
            seen = 0
            while seen < end:
                for m in consumer.consume(500, timeout=5.0):
                    if m.error() is None:
                        seen += 1
                        keys.add(m.key())
    finally:
        consumer.close()
    return keys


def _consume(pipeline: PipelineConfig, run: ChangelogRunConfig | None = None) -> None:
    for key in KEYS:
        consume_partition(pipeline, dict(pipeline.kafka), key, run or ChangelogRunConfig(),
                          HandlerRegistry(), group=pipeline.kafka["group.id"])


def _log(spark, pipeline: PipelineConfig) -> Counter:
    """The logs replica as (op, position, values) rows, each with its count."""
    rows = spark.table(f"{pipeline.lakehouse.database}.logs").collect()
    return Counter((r["_op"], tuple(r["_position"]), *(r[c] for c in LOG_COLUMNS))
                   for r in rows)


def _changelog_log(spark, pipeline: PipelineConfig) -> Counter:
    """The changes of keyless.logs in the changelog, keyed like `_log`."""
    from binlog_assets.lakehouse.columns import changelog_position

    frame = changelog_frame(spark, pipeline).where("`table` = 'keyless.logs'")
    return Counter((r["op"], tuple(r["p"])) for r in
                   frame.select("op", changelog_position().alias("p")).collect())


def test_keyless_tables_replicate_by_their_configured_rule(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, debezium_fence: DebeziumFence,
    pipeline_config: PipelineConfig,
    spark,
) -> None:
    pipeline = _config(pipeline_config)
    conn = mariadb.connect()
    logs = _workload(conn)
    ends = _published(pipeline, debezium_fence)
    # What the test is about: Debezium sends these rows without a Kafka key.
    assert _kafka_keys(dict(pipeline.kafka), ends) == {None}

    _consume(pipeline)
    builder = ReplicaBuilder(spark, pipeline)
    events = builder.apply("events")
    log = builder.apply("logs")

    assert events.key_rule == "key_columns" and events.warning is None
    assert shop.replica_rows(spark, pipeline.lakehouse.database, "events", spec=EVENTS) == \
        shop.source_rows(conn, "events", spec=EVENTS)
    assert log.key_rule == "append_only"
    assert "key_columns" in log.warning and "replica_mode: append" in log.warning
    first = _log(spark, pipeline)
    assert Counter(op for op, *_ in first.elements()) == logs
    assert Counter((op, pos) for op, pos, *_ in first.elements()) == _changelog_log(spark, pipeline)
    # The asset's row-count check counts the same from the changelog.
    assert expected_log_rows(spark, pipeline, "logs", log.applied_version) == sum(first.values())
    # The two identical inserts are two rows (two positions), each with its after-image.
    starts = [key for key in first.elements() if key[0] == "c" and key[3] == "start"]
    assert len({pos for _, pos, *_ in starts}) == 2
    assert {tuple(values) for _, _, *values in starts} == {("info", "start", 1)}

    # A replay of the topics from offset 0 and a replica rerun add no change twice.
    _consume(pipeline, ChangelogRunConfig(start_offset=0))
    assert builder.apply("logs").written == 0
    assert _log(spark, pipeline) == first
    rebuilt = builder.rebuild("logs")
    assert rebuilt.key_rule == "append_only" and _log(spark, pipeline) == first

    # New changes after the rerun land once each, for both replicas.
    with conn.cursor() as cur:
        cur.execute("INSERT INTO keyless.logs VALUES ('info', 'later', 9)")
        cur.execute("UPDATE keyless.events SET qty = 0 WHERE code = 'e5'")
    _published(pipeline, debezium_fence, after=ends)
    _consume(pipeline)
    builder.apply("events")
    assert builder.apply("logs").written == 1
    assert sum(_log(spark, pipeline).values()) == sum(first.values()) + 1
    assert shop.replica_rows(spark, pipeline.lakehouse.database, "events", spec=EVENTS) == \
        shop.source_rows(conn, "events", spec=EVENTS)


def _published(pipeline: PipelineConfig, fence: DebeziumFence,
               after: dict[str, int] | None = None) -> dict[str, int]:
    """End offsets of the keyless topics once Debezium is done (past `after`, if given)."""
    from binlog_assets.dev.demo import wait_for_debezium

    for _ in range(10):
        ends = wait_for_debezium(dict(pipeline.kafka), list(TOPICS), fence=fence)
        if after is None or all(ends[k] > after[k] for k in after):
            return ends
    raise TimeoutError(f"Debezium published nothing past {after}")
