"""`measure_lag` on the real broker: low, high and committed offsets, exactly; the lag
arithmetic and the error paths against a fake consumer.

One topic's partitions cover each case: committed by the group, never committed, empty,
a log start moved past the commit by `delete_records`, and transactions (a committed
batch, an aborted one, and one left open, whose records the high end under
`read_committed` stops before). The results must equal what the per-partition watermark
query (`get_watermark_offsets(cached=False)`) of the same consumer settings returns.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from binlog_assets.consume import lag
from binlog_assets.consume.lag import PartitionLag, measure_lag, topic_partitions
from binlog_assets.dev.kafka import KafkaBroker, create_topic


def _produce(bootstrap: str, topic: str, partition: int, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        p.produce(topic, f"v{i}".encode(), str(i).encode(), partition)
    assert p.flush(10) == 0


def _commit(bootstrap: str, group: str, offsets: list[TopicPartition]) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    try:
        c.commit(offsets=offsets, asynchronous=False)
    finally:
        c.close()


def _watermarks(conf: dict, topic: str, partitions: int) -> list[tuple[int, int]]:
    """The per-partition query measure_lag once made, one round trip per partition."""
    c = Consumer({**conf, "group.id": f"wm-{uuid.uuid4().hex[:6]}"})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)
                for p in range(partitions)]
    finally:
        c.close()


@pytest.fixture(scope="module")
def lag_topic(kafka_broker: KafkaBroker) -> Iterator[tuple[str, str]]:
    """A 5-partition topic and a group, with a transaction left open on partition 4.

    p0: 5 records, committed at 3.      p1: 4 records, never committed.
    p2: empty, never committed.         p3: 6 records, committed at 1, records before
                                            offset 4 deleted (log start 4).
    p4: a committed transaction of 2 records (offsets 0-1, marker 2), an aborted one of 3
        (3-5, marker 6), then an open one of 2 (7-8); committed at 2.
    """
    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, "lag", partitions=5)
    group = f"lag-{uuid.uuid4().hex[:6]}"
    _produce(bootstrap, topic, 0, 5)
    _produce(bootstrap, topic, 1, 4)
    _produce(bootstrap, topic, 3, 6)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.delete_records([TopicPartition(topic, 3, 4)]).values():
        f.result(30)

    tx = Producer({"bootstrap.servers": bootstrap,
                   "transactional.id": f"lag-tx-{uuid.uuid4().hex[:6]}"})
    tx.init_transactions(30)
    for n, end in ((2, tx.commit_transaction), (3, tx.abort_transaction)):
        tx.begin_transaction()
        for i in range(n):
            tx.produce(topic, b"tx", str(i).encode(), 4)
        assert tx.flush(10) == 0  # an abort purges what is not yet written
        end(30)
    tx.begin_transaction()
    for i in range(2):
        tx.produce(topic, b"open", str(i).encode(), 4)
    assert tx.flush(10) == 0

    _commit(bootstrap, group, [TopicPartition(topic, 0, 3), TopicPartition(topic, 3, 1),
                               TopicPartition(topic, 4, 2)])
    try:
        yield topic, group
    finally:
        tx.abort_transaction(30)


def test_read_committed_stops_at_the_open_transaction(
    kafka_broker: KafkaBroker, lag_topic: tuple[str, str]
) -> None:
    topic, group = lag_topic
    conf = {"bootstrap.servers": kafka_broker.bootstrap_servers,
            "isolation.level": "read_committed"}
    lags = measure_lag(conf, group, [topic])
    assert lags == [
        PartitionLag(topic, 0, 0, 5, 3),
        PartitionLag(topic, 1, 0, 4, None),
        PartitionLag(topic, 2, 0, 0, None),
        PartitionLag(topic, 3, 4, 6, 1),
        PartitionLag(topic, 4, 0, 7, 2),  # the last stable offset: the open txn's first
    ]
    assert [pl.lag for pl in lags] == [2, 4, 0, 2, 5]
    assert [pl.checkpoint for pl in lags] == [3, 0, 0, 4, 2]
    assert [(pl.low, pl.high) for pl in lags] == _watermarks(conf, topic, 5)


def test_read_uncommitted_counts_the_open_transaction(
    kafka_broker: KafkaBroker, lag_topic: tuple[str, str]
) -> None:
    topic, group = lag_topic
    conf = {"bootstrap.servers": kafka_broker.bootstrap_servers,
            "isolation.level": "read_uncommitted"}
    lags = measure_lag(conf, group, [topic])
    assert [(pl.partition, pl.low, pl.high, pl.committed, pl.lag) for pl in lags] == [
        (0, 0, 5, 3, 2), (1, 0, 4, None, 4), (2, 0, 0, None, 0), (3, 4, 6, 1, 2),
        (4, 0, 9, 2, 7),
    ]
    assert [(pl.low, pl.high) for pl in lags] == _watermarks(conf, topic, 5)


def test_librdkafka_default_isolation_is_read_committed(
    kafka_broker: KafkaBroker, lag_topic: tuple[str, str]
) -> None:
    topic, group = lag_topic
    lags = measure_lag({"bootstrap.servers": kafka_broker.bootstrap_servers}, group, [topic])
    assert lags[4] == PartitionLag(topic, 4, 0, 7, 2)


def test_topics_in_the_order_given_partitions_sorted_missing_skipped(
    kafka_broker: KafkaBroker,
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    a = create_topic(bootstrap, "lag-a", partitions=3)
    b = create_topic(bootstrap, "lag-b", partitions=2)
    group = f"lag-{uuid.uuid4().hex[:6]}"
    for p in range(3):
        _produce(bootstrap, a, p, p + 1)
    _produce(bootstrap, b, 1, 2)
    _commit(bootstrap, group, [TopicPartition(a, 2, 3), TopicPartition(b, 1, 1)])

    conf = {"bootstrap.servers": bootstrap, "isolation.level": "read_committed"}
    missing = f"lag-missing-{uuid.uuid4().hex[:8]}"
    assert measure_lag(conf, group, [b, missing, a]) == [
        PartitionLag(b, 0, 0, 0, None),
        PartitionLag(b, 1, 0, 2, 1),
        PartitionLag(a, 0, 0, 1, None),
        PartitionLag(a, 1, 0, 2, None),
        PartitionLag(a, 2, 0, 3, 3),
    ]
    assert measure_lag(conf, group, [missing]) == []
    assert measure_lag(conf, group, []) == []


@pytest.mark.parametrize(("low", "high", "committed", "checkpoint", "expected_lag"), [
    (0, 10, 4, 4, 6),
    (0, 10, None, 0, 10),    # nothing committed: everything in the log is unread
    (5, 10, None, 5, 5),
    (5, 10, 2, 5, 5),        # retention moved the log start past the commit
    (0, 10, 10, 10, 0),
    (0, 10, 12, 12, 0),      # a commit past the high end (read_committed) is no debt
])
def test_lag_counts_from_the_checkpoint_never_below_the_log_start(
        low: int, high: int, committed: int | None, checkpoint: int, expected_lag: int) -> None:
    pl = PartitionLag("t", 0, low, high, committed)
    assert (pl.checkpoint, pl.lag) == (checkpoint, expected_lag)


class FakeConsumer:
    """Two topics: `a` with partitions 2, 0, 1 (listed unsorted) and `broken`, whose
    metadata carries an error. Offsets: low 1, high 9 and committed 4 on `a`[1] only;
    `fail_partition` makes that partition's ListOffsets answer an error."""

    instances: list[FakeConsumer] = []
    fail_partition: int | None = None

    def __init__(self, conf: dict) -> None:
        self.conf = conf
        self.closed = False
        FakeConsumer.instances.append(self)

    def list_topics(self, timeout: float) -> SimpleNamespace:
        return SimpleNamespace(topics={
            "a": SimpleNamespace(error=None, partitions={2: None, 0: None, 1: None}),
            "broken": SimpleNamespace(error=KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART),
                                      partitions={0: None}),
        })

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 4 if tp.partition == 1 else
                               OFFSET_INVALID) for tp in tps]

    def offsets_for_times(self, tps: list[TopicPartition], timeout: float
                          ) -> list[SimpleNamespace]:
        # The answer's order is the broker's, not the request's.
        return [SimpleNamespace(
            topic=tp.topic, partition=tp.partition,
            offset=(1 if tp.offset == OFFSET_BEGINNING else 9) if tp.partition == 1 else 0,
            error=(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)
                   if tp.partition == self.fail_partition else None),
        ) for tp in reversed(tps)]

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_consumer(monkeypatch: pytest.MonkeyPatch) -> type[FakeConsumer]:
    monkeypatch.setattr(lag, "Consumer", FakeConsumer)
    # No cluster behind the fake: its check (tested on real brokers) is skipped too.
    monkeypatch.setattr(lag, "check_cluster", lambda conf: None)
    monkeypatch.setattr(FakeConsumer, "instances", [])
    return FakeConsumer


def test_lags_in_partition_order_whatever_order_the_broker_answers(
        fake_consumer: type[FakeConsumer]) -> None:
    lags = measure_lag({"bootstrap.servers": "b:9092"}, "g", ["broken", "a"])
    assert lags == [PartitionLag("a", 0, 0, 0, None), PartitionLag("a", 1, 1, 9, 4),
                    PartitionLag("a", 2, 0, 0, None)]
    [consumer] = fake_consumer.instances
    assert consumer.conf == {"bootstrap.servers": "b:9092", "group.id": "g",
                             "enable.auto.commit": False}
    assert consumer.closed


def test_a_partition_error_raises_and_the_consumer_is_closed(
        fake_consumer: type[FakeConsumer], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FakeConsumer, "fail_partition", 2)
    with pytest.raises(KafkaException):
        measure_lag({}, "g", ["a"])
    assert fake_consumer.instances[0].closed


def test_topic_regexes_expand_over_the_cluster_topics() -> None:
    consumer = FakeConsumer({})
    # `^a$` matches `a` only; `broken` (an errored topic) and unknown names give nothing.
    assert topic_partitions(consumer, ["^a$", "a", "missing"]) == [("a", 0), ("a", 1), ("a", 2)]
    assert topic_partitions(consumer, ["^b"]) == []
