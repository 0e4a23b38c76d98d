"""The dev source stack is real: MariaDB's ROW binlog reaches Kafka through Debezium.

Row changes made in MariaDB arrive on `<prefix>.<db>.<table>` as Debezium envelopes that
`DebeziumDecoder` turns into the same ops, in binlog order, with real binlog positions;
rows that existed before a connector started arrive as snapshot reads.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pymysql
import pytest
from confluent_kafka import Consumer, Message, TopicPartition

from binlog_assets.config import parse_config
from binlog_assets.dev import stack
from binlog_assets.dev.connect import DebeziumConnector, DebeziumFence, KafkaConnect
from binlog_assets.dev.kafka import KafkaBroker
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.formats.debezium import DebeziumDecoder
from binlog_assets.formats.event import SNAPSHOT_ROW, ChangeEvent, Position

# Connect may still be creating a topic when the first poll runs; a shared 2-core box
# can take a while, so waits are generous and end as soon as the records are in.
_WAIT = 120.0


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _consumer(broker: KafkaBroker) -> Consumer:
    return Consumer({
        "bootstrap.servers": broker.bootstrap_servers, "group.id": _unique("source-test"),
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        # Topics appear when Debezium writes their first record, after the subscribe.
        "topic.metadata.refresh.interval.ms": 500,
    })


def _consume(
    broker: KafkaBroker, topic: str, done: Callable[[list[Message]], bool]
) -> list[Message]:
    """Records of `topic` from the start, until `done(records)` or the wait runs out."""
    consumer = _consumer(broker)
    records: list[Message] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + _WAIT
        while time.monotonic() < deadline and not done(records):
            for message in consumer.consume(num_messages=100, timeout=0.5):
                if message.error() is None:
                    records.append(message)
    finally:
        consumer.close()
    return records


def _decode(records: list[Message], decoder: DebeziumDecoder | None = None) -> list[ChangeEvent]:
    decoder = decoder or DebeziumDecoder()
    return [
        event
        for m in records
        for event in decoder.decode(
            m.value(), topic=m.topic(), partition=m.partition(), offset=m.offset(), key=m.key()
        )
    ]


def _execute(server: MariaDBServer, *statements: str) -> None:
    with server.connect() as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


@pytest.mark.integration
def test_mariadb_writes_a_row_binlog_on_loopback(mariadb: MariaDBServer) -> None:
    with mariadb.connect() as conn, conn.cursor() as cur:
        cur.execute(
            "SHOW VARIABLES WHERE Variable_name IN "
            "('log_bin', 'binlog_format', 'binlog_row_image', 'server_id', 'bind_address', "
            "'tmpdir')"
        )
        variables = dict(cur.fetchall())
        cur.execute("SHOW GRANTS FOR %s@'%%'", (mariadb.debezium_user,))
        grants = cur.fetchone()[0]
    assert variables == {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
                         "server_id": "1", "bind_address": "127.0.0.1",
                         # Its own temporary files: another process's /tmp cleanup once
                         # removed a bootstrap's temporary tables mid-install.
                         "tmpdir": str(mariadb.tmpdir)}
    for privilege in ("SELECT", "RELOAD", "SHOW DATABASES", "LOCK TABLES",
                      "REPLICATION SLAVE", "BINLOG MONITOR"):
        assert privilege in grants
    # Debezium's own account, over TCP as the connector connects, may read binlog status.
    conn = pymysql.connect(host="127.0.0.1", port=mariadb.port, user=mariadb.debezium_user,
                           password=mariadb.debezium_password)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            binlog_file, binlog_pos = cur.fetchone()[:2]
    finally:
        conn.close()
    assert binlog_file.startswith("binlog.")
    assert binlog_pos > 0


@pytest.mark.integration
def test_row_changes_stream_in_binlog_order(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, kafka_broker: KafkaBroker
) -> None:
    table = _unique("orders")
    _execute(
        mariadb,
        "CREATE DATABASE IF NOT EXISTS shop",
        f"CREATE TABLE shop.{table} (id INT PRIMARY KEY, item VARCHAR(40) NOT NULL, "
        "amount DECIMAL(10,2) NOT NULL)",
        # Two rows in one statement share a binlog event: they differ only in `row`.
        f"INSERT INTO shop.{table} VALUES (1, 'pen', 1.50), (2, 'ink', 12.00)",
        f"INSERT INTO shop.{table} VALUES (3, 'pad', 4.25)",
        f"UPDATE shop.{table} SET amount = 13.10 WHERE id = 2",
        f"DELETE FROM shop.{table} WHERE id = 1",
    )

    # Five changes, then the delete's tombstone.
    prefix = debezium_connect.connector.topic_prefix
    records = _consume(kafka_broker, f"{prefix}.shop.{table}",
                       lambda got: len(got) >= 6)
    events = _decode(records)

    assert [(e.op, e.key) for e in events] == [
        ("c", (1,)), ("c", (2,)), ("c", (3,)), ("u", (2,)), ("d", (1,)),
    ]
    assert len(records) == 6 and records[-1].value() is None
    assert all(e.table == f"shop.{table}" and e.key_columns == ("id",) for e in events)
    positions = [e.position for e in events]
    assert all(not p.snapshot and p.file > 0 and p.pos > 0 for p in positions)
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert (positions[0].pos, positions[0].row) == (positions[1].pos, 0)
    assert positions[1].row == 1
    update = events[3]
    assert update.before == {"id": 2, "item": "ink", "amount": Decimal("12.00")}
    assert update.after == {"id": 2, "item": "ink", "amount": Decimal("13.10")}
    assert events[4].before == {"id": 1, "item": "pen", "amount": Decimal("1.50")}
    assert update.column_types == {"id": "int", "item": "string", "amount": "decimal(10,2)"}


@pytest.mark.integration
def test_a_fenced_wait_returns_offsets_past_every_change_committed_before_it(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, kafka_broker: KafkaBroker
) -> None:
    """No quiet period to guess: the wait ends once Connect has committed the source
    offset of a fence row written after the changes, so the end offsets it returns hold
    every change, a backlog of thousands across topics too; a connector that publishes
    nothing more never passes the fence."""
    from binlog_assets.dev.demo import wait_for_debezium

    prefix = debezium_connect.connector.topic_prefix
    tables = [_unique("fenced") for _ in range(3)]
    kafka_conf = {"bootstrap.servers": kafka_broker.bootstrap_servers}
    fence = DebeziumFence(debezium_connect, mariadb)
    rows = ", ".join(f"({i}, '{'x' * 200}')" for i in range(1, 2001))
    _execute(mariadb, "CREATE DATABASE IF NOT EXISTS shop",
             *(f"CREATE TABLE shop.{t} (id INT PRIMARY KEY, v VARCHAR(200))" for t in tables),
             *(f"INSERT INTO shop.{t} VALUES {rows}" for t in tables[:-1]),
             f"INSERT INTO shop.{tables[-1]} VALUES (1, 'last')")
    topics = [f"{prefix}.shop.{t}" for t in tables]
    ends = wait_for_debezium(kafka_conf, topics, fence=fence)
    assert ends == {f"{topics[0]}:0": 2000, f"{topics[1]}:0": 2000, f"{topics[2]}:0": 1}

    name = debezium_connect.connector.name
    debezium_connect._rest("PUT", f"/connectors/{name}/pause")
    try:
        _execute(mariadb, f"INSERT INTO shop.{tables[-1]} VALUES (2, 'paused')")
        with pytest.raises(TimeoutError, match="did not commit a source offset past the fence"):
            fence.wait(timeout=3.0)
    finally:
        debezium_connect._rest("PUT", f"/connectors/{name}/resume")
    assert wait_for_debezium(kafka_conf, topics, fence=fence)[f"{topics[2]}:0"] == 2


@pytest.mark.integration
def test_unsigned_and_wide_numbers_arrive_exact_and_exactly_typed(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, kafka_broker: KafkaBroker
) -> None:
    table = _unique("accounts")
    _execute(
        mariadb,
        "CREATE DATABASE IF NOT EXISTS shop",
        f"CREATE TABLE shop.{table} (id BIGINT UNSIGNED PRIMARY KEY, n INT UNSIGNED, "
        "balance DECIMAL(20,2), waited TIME(6))",
        # Above 2^63: with the connector's default bigint.unsigned.handling.mode=long
        # this id arrived as -265.
        f"INSERT INTO shop.{table} VALUES "
        "(18446744073709551351, 4294967295, 123456789012345678.91, '-838:59:59')",
    )

    topic = f"{debezium_connect.connector.topic_prefix}.shop.{table}"
    [event] = _decode(_consume(kafka_broker, topic, lambda got: len(got) >= 1))

    assert event.key == (18446744073709551351,)
    assert event.after == {"id": 18446744073709551351, "n": 4294967295,
                           "balance": Decimal("123456789012345678.91"), "waited": "-838:59:59"}
    assert event.column_types == {"id": "decimal(20,0)", "n": "bigint",
                                  "balance": "decimal(20,2)", "waited": "string"}


@pytest.mark.integration
def test_schema_changes_reach_the_prefix_topic(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, kafka_broker: KafkaBroker
) -> None:
    table = _unique("customers")
    _execute(
        mariadb,
        "CREATE DATABASE IF NOT EXISTS shop",
        f"CREATE TABLE shop.{table} (id BIGINT PRIMARY KEY, email VARCHAR(80))",
        f"ALTER TABLE shop.{table} ADD COLUMN created DATE",
    )

    def table_ddls(records: list[Message]) -> list[ChangeEvent]:
        return [e for e in _decode(records) if e.table == f"shop.{table}"]

    schema_topic = debezium_connect.connector.topic_prefix
    events = table_ddls(
        _consume(kafka_broker, schema_topic, lambda got: len(table_ddls(got)) >= 2)
    )

    assert [e.op for e in events] == ["ddl", "ddl"]
    assert events[0].ddl.startswith("CREATE TABLE")
    assert "ADD COLUMN" in events[1].ddl
    assert events[1].key_columns == ("id",)
    assert events[1].column_types == {"id": "bigint", "email": "string", "created": "date"}
    assert events[0].position < events[1].position


@pytest.mark.integration
def test_rows_present_before_a_connector_starts_arrive_as_snapshot_reads(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, kafka_broker: KafkaBroker
) -> None:
    database = _unique("snap")
    _execute(
        mariadb,
        f"CREATE DATABASE {database}",
        f"CREATE TABLE {database}.items (id INT PRIMARY KEY, name VARCHAR(20))",
        f"INSERT INTO {database}.items VALUES (1, 'a'), (2, 'b'), (3, 'c')",
    )
    # A second connector in the running worker, confined to the new database, has to
    # snapshot it; its own replica id keeps MariaDB from dropping the session's stream.
    connector = DebeziumConnector.for_server(
        mariadb, name=database, topic_prefix=database, server_id=184055,
        database_include_list=(database,),
        # The task is RUNNING a while before its snapshot begins; a delay makes that
        # window wide enough that "ready" cannot mean "RUNNING" and pass by luck.
        extra={"snapshot.delay.ms": "2000"},
    )
    ready = debezium_connect.add_connector(connector)
    topic = f"{database}.{database}.items"
    try:
        # Written the moment the connector is ready: it must stream as a change, not be
        # folded into a snapshot still under way (a RUNNING task may still be snapshotting).
        _execute(mariadb, f"INSERT INTO {database}.items VALUES (4, 'd')")
        events = _decode(_consume(kafka_broker, topic, lambda got: len(got) >= 4))
        snapshot, end, streamed = events[:3], events[3], events[4]
    finally:
        debezium_connect.remove_connector(connector.name)
    print(f"\nsnapshot connector running in {ready:.1f}s")

    assert [(e.op, e.key, e.position.row) for e in snapshot] == [
        ("r", (1,), SNAPSHOT_ROW), ("r", (2,), SNAPSHOT_ROW), ("r", (3,), SNAPSHOT_ROW),
    ]
    assert snapshot[0].after == {"id": 1, "name": "a"}
    # The table's last snapshot row is followed by its snapshot end, below the rows.
    assert (end.op, end.position) == ("t", snapshot[-1].position._replace(row=-3))
    assert (streamed.op, streamed.key, streamed.position.snapshot) == ("c", (4,), False)
    assert streamed.position.file > 0 and streamed.position.pos > 0
    assert all(e.position < streamed.position for e in snapshot)
    assert snapshot[0].position == Position(1, *snapshot[0].position.coordinates)


@pytest.mark.integration
def test_insert_reaches_kafka_within_seconds(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, kafka_broker: KafkaBroker
) -> None:
    table = _unique("pings")
    topic = f"{debezium_connect.connector.topic_prefix}.shop.{table}"
    _execute(
        mariadb,
        "CREATE DATABASE IF NOT EXISTS shop",
        f"CREATE TABLE shop.{table} (id INT PRIMARY KEY)",
        f"INSERT INTO shop.{table} VALUES (0)",
    )
    # The first row creates the topic; the timed inserts are read from its end, fixed
    # before the first insert so that no record lands ahead of the consumer's start.
    assert _consume(kafka_broker, topic, lambda got: len(got) >= 1)
    consumer = _consumer(kafka_broker)
    latencies = []
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10,
                                                cached=False)
        consumer.assign([TopicPartition(topic, 0, end)])
        with mariadb.connect() as conn, conn.cursor() as cur:
            for i in range(1, 6):
                began = time.monotonic()
                cur.execute(f"INSERT INTO shop.{table} VALUES ({i})")
                message = None
                while message is None and time.monotonic() - began < _WAIT:
                    message = consumer.poll(0.01)
                    if message is not None and message.error() is not None:
                        message = None
                assert message is not None, f"insert {i} not on {topic} after {_WAIT}s"
                latencies.append(time.monotonic() - began)
                assert _decode([message])[0].key == (i,)
    finally:
        consumer.close()
    print(f"\nINSERT -> Kafka latency: median {statistics.median(latencies) * 1000:.0f} ms, "
          f"max {max(latencies) * 1000:.0f} ms over {len(latencies)} inserts")
    assert max(latencies) < 30


@pytest.mark.integration
def test_start_reuses_the_running_server_and_worker(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, kafka_broker: KafkaBroker
) -> None:
    again = MariaDBServer(mariadb.data_dir)
    again.start(timeout=30)
    assert (again.port, again.running_pid()) == (mariadb.port, mariadb.running_pid())

    worker = KafkaConnect(debezium_connect.data_dir, kafka_broker.bootstrap_servers,
                          debezium_connect.connector)
    assert worker.start(timeout=60) < 10
    assert (worker.port, worker.running_pid()) == (
        debezium_connect.port, debezium_connect.running_pid()
    )
    assert "binlake-mariadb: connector=RUNNING tasks=RUNNING" in worker.status()


def test_source_stack_is_skipped_for_a_configured_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BINLAKE_VAR_DIR", str(tmp_path / "var"))
    pipeline = parse_config({"kafka": {"bootstrap.servers": "broker-1:9092"}})

    for action in (stack.source_up, stack.source_down, stack.source_status):
        message = action(pipeline)
        assert message.startswith("source stack: skipped")
        assert "broker-1:9092" in message
    assert not (tmp_path / "var").exists()
    assert stack.source_skip_reason(parse_config({})) is None
