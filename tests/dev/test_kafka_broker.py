"""The embedded broker is a real Kafka: round trips, commits and transactions."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from binlog_assets.dev.kafka import KafkaBroker, abort_transaction, create_topic


def _topic(broker: KafkaBroker, partitions: int = 1) -> str:
    return create_topic(broker.bootstrap_servers, "t", partitions)


def _consumer(broker: KafkaBroker, group: str, **extra) -> Consumer:
    return Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest", **extra})


def _drain(consumer: Consumer, want: int, rounds: int = 40) -> list:
    got = []
    for _ in range(rounds):
        for m in consumer.consume(num_messages=100, timeout=0.5):
            assert m.error() is None, m.error()
            got.append(m)
        if len(got) >= want:
            break
    return got


def test_produce_consume_commit_round_trip(kafka_broker: KafkaBroker) -> None:
    topic = _topic(kafka_broker)
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    for i in range(10):
        p.produce(topic, key=str(i).encode(), value=f"v{i}".encode())
    assert p.flush(10) == 0

    c = _consumer(kafka_broker, "g1")
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        msgs = _drain(c, 10)
        assert [m.value() for m in msgs] == [f"v{i}".encode() for i in range(10)]
        c.commit(offsets=[TopicPartition(topic, 0, 7, metadata="done:8,9")], asynchronous=False)
        committed = c.committed([TopicPartition(topic, 0)], timeout=10)[0]
        assert committed.offset == 7
        assert committed.metadata == "done:8,9"
    finally:
        c.close()

    # A new consumer of the group resumes at the committed offset.
    c2 = _consumer(kafka_broker, "g1")
    try:
        c2.subscribe([topic])
        msgs = _drain(c2, 3)
        assert [m.offset() for m in msgs] == [7, 8, 9]
    finally:
        c2.close()


def test_transactional_produce_hides_aborted_and_leaves_offset_gaps(
    kafka_broker: KafkaBroker,
) -> None:
    topic = _topic(kafka_broker)
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers,
                  "transactional.id": f"tx-{uuid.uuid4().hex[:6]}"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"committed-1")
    p.produce(topic, value=b"committed-2")
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce(topic, value=b"aborted")
    abort_transaction(p, 30)
    p.begin_transaction()
    p.produce(topic, value=b"committed-3")
    p.commit_transaction(30)

    c = _consumer(kafka_broker, "g-tx", **{"isolation.level": "read_committed"})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        msgs = _drain(c, 3)
        assert [m.value() for m in msgs] == [b"committed-1", b"committed-2", b"committed-3"]
        offsets = [m.offset() for m in msgs]
        # The commit marker, the aborted record and its abort marker occupy offsets
        # nobody receives.
        assert offsets == [0, 1, 5]
        _, high = c.get_watermark_offsets(TopicPartition(topic, 0), cached=False)
        assert high == 7
    finally:
        c.close()


def test_an_abort_right_after_a_commit_is_accepted(kafka_broker: KafkaBroker) -> None:
    # The coordinator is still completing each commit when the next transaction's first
    # record asks to add its partition; an abort in that window used to fail fatally
    # with INVALID_TXN_STATE (about one round in three here, every delay of 2-20 ms).
    topic = _topic(kafka_broker)
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers,
                  "transactional.id": f"tx-{uuid.uuid4().hex[:6]}"})
    p.init_transactions(30)
    rounds = 10
    for _ in range(rounds):
        p.begin_transaction()
        p.produce(topic, value=b"committed")
        p.commit_transaction(30)
        p.begin_transaction()
        p.produce(topic, value=b"aborted")
        time.sleep(0.01)  # lets librdkafka send the AddPartitionsToTxn before the abort
        abort_transaction(p, 30)

    c = _consumer(kafka_broker, "g-tx-race", **{"isolation.level": "read_committed"})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        msgs = _drain(c, rounds)
        assert [m.value() for m in msgs] == [b"committed"] * rounds
        # Each round: a record and its commit marker, an aborted record and its marker.
        _, high = c.get_watermark_offsets(TopicPartition(topic, 0), cached=False)
        assert high == 4 * rounds
    finally:
        c.close()


def test_start_is_idempotent(kafka_broker: KafkaBroker) -> None:
    again = KafkaBroker(kafka_broker.data_dir)
    again.start(timeout=30)
    assert again.bootstrap_servers == kafka_broker.bootstrap_servers
    assert again.running_pid() == kafka_broker.running_pid()


def test_a_c1_broker_stops_its_jit_at_c1_and_a_default_one_does_not(
        kafka_broker: KafkaBroker, tmp_path) -> None:
    """The tests' brokers run C1 only (`c1=True`); a broker made without it, as the stack's
    and the benches' are, keeps the JVM's tiered JIT."""
    running = Path(f"/proc/{kafka_broker.running_pid()}/cmdline").read_text().split("\0")
    assert "-XX:TieredStopAtLevel=1" in running
    assert "-XX:TieredStopAtLevel=1" not in KafkaBroker(tmp_path)._java_cmd("kafka.Kafka")
