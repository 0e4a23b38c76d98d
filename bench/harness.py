"""What every benchmark shares: its own broker, a Debezium workload, the consumer settings.

Each benchmark script starts a fresh `KafkaBroker` in a temporary directory, produces its
data with `produce_debezium` (schema-less Debezium envelopes as the MySQL connector
writes them, keyed by the primary key's JSON), and gives the baseline and binlake the
same effective consumer settings (binlake's defaults, `BASELINE_CONF`), so a ratio compares
code paths, not settings.
The envelopes are formatted from byte templates rather than `orjson.dumps`: the bytes
are the same shape, and producing ten million of them stays a matter of seconds.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from binlog_assets.consume.run import RunSettings
from binlog_assets.consume.runtime import consumer_defaults
from binlog_assets.dev.kafka import KafkaBroker
from binlog_assets.dev.kafka import create_topic as new_topic

if TYPE_CHECKING:
    from binlog_assets.config import PipelineConfig
    from binlog_assets.orchestration.resources import BinlakeResource

# What a user's Kafka config says, for binlake: the rest is the product's own default.
CONSUMER_CONF = {
    "auto.offset.reset": "earliest",
    "isolation.level": "read_committed",
}

# The baselines get the librdkafka settings a run uses by default (its prefetch, derived
# from max_in_flight; see `binlog_assets.consume.runtime.consumer_defaults`), so a ratio
# compares code paths, not settings.
BASELINE_CONF = {**consumer_defaults(RunSettings.max_in_flight), **CONSUMER_CONF}

PRODUCER_CONF = {
    "linger.ms": 50,
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "acks": 1,
    "delivery.report.only.error": True,
}

# Wide rows (~400 B records): the shape of an OLTP `orders` row with its source block.
_WIDE_ROW = (
    b'{"id":%d,"customer_id":%d,"status":"%s","amount":"%d.%02d","qty":%d,'
    b'"updated_at":%d}'
)
_WIDE_SOURCE = (
    b'"source":{"connector":"mysql","name":"shop","ts_ms":%d,"snapshot":"false",'
    b'"db":"shop","table":"orders","server_id":223344,"file":"mysql-bin.%06d","pos":%d,'
    b'"row":%d}'
)
# Small rows (~200 B records), for backlogs of many millions.
_SMALL_ROW = b'{"id":%d,"qty":%d}'
_SMALL_SOURCE = (
    b'"source":{"db":"shop","table":"stock","file":"mysql-bin.%06d","pos":%d,"row":0,'
    b'"ts_ms":%d,"snapshot":"false"}'
)
_STATUSES = (b"pending", b"paid", b"shipped", b"delivered", b"cancelled")
_OPS = (b"c", b"c", b"u", b"u", b"u", b"u", b"u", b"u", b"d", b"d")  # 20% c, 60% u, 20% d
_BASE_TS = 1_795_000_000_000


@dataclass(frozen=True)
class Produced:
    topic: str
    messages: int
    payload_bytes: int
    seconds: float

    @property
    def mean_size(self) -> float:
        return self.payload_bytes / self.messages if self.messages else 0.0


@contextmanager
def running_broker(heap: str = "1g") -> Iterator[KafkaBroker]:
    """A fresh broker in a temporary directory, stopped and removed on the way out."""
    data_dir = Path(tempfile.mkdtemp(prefix="binlake-bench-"))
    broker = KafkaBroker(data_dir / "kafka", heap=heap)
    try:
        seconds = broker.start()
        print(f"broker {broker.bootstrap_servers} ready in {seconds:.1f}s; {load_average()}",
              flush=True)
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def create_topic(bootstrap: str, prefix: str) -> str:
    """A new one-partition topic, with the broker's group coordinator up."""
    name = new_topic(bootstrap, prefix, timeout=30)
    warm_group_coordinator(bootstrap, name)
    return name


def warm_group_coordinator(bootstrap: str, topic: str) -> None:
    """Read a committed offset once, so the broker creates `__consumer_offsets`.

    A fresh broker creates that topic (50 partitions) at the first group request, which
    takes 0.1-0.7 s here. Every cluster a run meets already has it, so it is no part of
    a run's start-up, and without this the first measured run would pay it.
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id("warm-up")})
    try:
        for attempt in range(50):
            try:
                consumer.committed([TopicPartition(topic, 0)], timeout=30)
                return
            except KafkaException:
                time.sleep(0.1 * (attempt + 1))  # the coordinator is still loading
        consumer.committed([TopicPartition(topic, 0)], timeout=30)
    finally:
        consumer.close()


def debezium_records(
    count: int, keys: int, *, small: bool = False, seed: int = 7, first_id: int = 0
) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) pairs: Debezium envelopes of `keys` distinct ids, positions increasing.

    Every run of `keys` records holds each id once, in a fresh random order, so every id
    appears and all about equally often (ids run from `first_id`, so producers in parallel
    can own disjoint ids). The binlog position grows with every record, so
    per key the positions increase in production (and so partition) order, which is what
    the ordering checks rely on.
    """
    rng = random.Random(seed)
    randrange = rng.randrange
    deck = list(range(first_id, first_id + keys))
    pos = 4
    for i in range(count):
        if i % keys == 0:
            rng.shuffle(deck)
        ident = deck[i % keys]
        op = _OPS[randrange(10)]
        ts = _BASE_TS + i
        pos += 180 + (i % 7) * 40
        if small:
            row = _SMALL_ROW % (ident, i % 50)
            source = _SMALL_SOURCE % (42, pos, ts)
        else:
            row = _WIDE_ROW % (ident, ident * 7 % 100_000, _STATUSES[i % 5], i % 900,
                               i % 100, 1 + i % 9, ts)
            source = _WIDE_SOURCE % (ts, 42 + pos // 1_000_000_000, pos, 0)
        if op == b"c":
            before, after = b"null", row
        elif op == b"d":
            before, after = row, b"null"
        else:
            before = row.replace(b'"qty":', b'"qty":1', 1) if not small else row
            after = row
        value = b'{"before":%s,"after":%s,%s,"op":"%s","ts_ms":%d}' % (
            before, after, source, op, ts + 7)
        yield b'{"id":%d}' % ident, value


def produce_debezium(
    bootstrap: str, topic: str, count: int, keys: int, *, small: bool = False, seed: int = 7,
    first_id: int = 0, expect_end: int | None = None,
) -> Produced:
    """Produce `count` records to partition 0 of `topic`; fails unless all were written.

    The partition must then end at `expect_end` (default `count`: this is its only
    producer); pass -1 when other producers write to it at the same time.
    """
    size, seconds = produce_records(
        bootstrap, ((topic, key, value) for key, value in
                    debezium_records(count, keys, small=small, seed=seed, first_id=first_id)))
    expect_end = count if expect_end is None else expect_end
    if expect_end >= 0:
        _low, high = end_offsets(bootstrap, topic)
        if high != expect_end:
            raise RuntimeError(f"expected {expect_end} records in {topic}, it has {high}")
    return Produced(topic, count, size, seconds)


def produce_records(bootstrap: str, records: Iterable[tuple[str, bytes, bytes]]
                    ) -> tuple[int, float]:
    """Produce (topic, key, value) records to partition 0 of their topics; the value bytes
    and the seconds it took. Fails unless every record was delivered."""
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONF})
    produce = producer.produce
    began = time.monotonic()
    size = 0
    for topic, key, value in records:
        size += len(value)
        while True:
            try:
                produce(topic, value, key, 0, on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
    left = producer.flush(120)
    seconds = time.monotonic() - began
    if left or errors:
        raise RuntimeError(f"production failed: {left} undelivered, errors {errors[:3]}")
    return size, seconds


def end_offsets(bootstrap: str, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30,
                                              cached=False)
    finally:
        consumer.close()


def group_id(role: str) -> str:
    return f"bench-{role}-{uuid.uuid4().hex[:8]}"


def kafka_conf(bootstrap: str) -> dict:
    """binlake's Kafka config: the user's part only."""
    return {"bootstrap.servers": bootstrap, **CONSUMER_CONF}


def baseline_conf(bootstrap: str) -> dict:
    """A baseline loop's consumer config: the same effective settings as binlake's."""
    return {"bootstrap.servers": bootstrap, **BASELINE_CONF}


def plain_consumer(bootstrap: str, role: str) -> Consumer:
    """A consumer for a baseline loop: the shared settings, EOF events like BoundedRun's."""
    return Consumer({**baseline_conf(bootstrap), "group.id": group_id(role),
                     "enable.auto.commit": False, "enable.partition.eof": True})


def serial_batches(consumer: Consumer, partitions: list[TopicPartition], total: int,
                   batch_size: int) -> Iterator[list]:
    """The baselines' read loop: `partitions` from their given offsets, batch by batch,
    until `total` records came (EOF events skipped, any other error raised)."""
    consumer.assign(partitions)
    records = 0
    while records < total:
        # Never ask for more than is left: a short final batch would wait the timeout.
        batch = []
        for msg in consumer.consume(num_messages=min(batch_size, total - records),
                                    timeout=1.0):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"kafka error: {err}")
            batch.append(msg)
        records += len(batch)
        yield batch


def decode_message(decoder, msg) -> list:  # a ChangeDecoder, a Message
    """The events of one consumed record, as a BoundedRun decodes them."""
    return decoder.decode(msg.value(), topic=msg.topic(), partition=msg.partition(),
                          offset=msg.offset(), key=msg.key(), headers=msg.headers())


def load_average() -> str:
    """The 1-minute load average: on a shared 2-core machine it says how noisy a run was."""
    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


@dataclass
class FollowerLocation:
    pipeline: PipelineConfig
    resource: BinlakeResource
    home: Path  # DAGSTER_HOME with the project's setup/dagster.yaml


def follower_location(work: Path, bootstrap: str, topics: list[str], name: str,
                      follow_seconds: float, poll_seconds: float) -> FollowerLocation:
    """A config over `topics` (one Debezium source) with a changelog follower's settings,
    written to `work`, its resource, and a Dagster home with the project's instance
    config (SQLite), for running `follow_changelog_job` in process."""
    from binlog_assets.config import parse_config
    from binlog_assets.environment import REPO_ROOT
    from binlog_assets.orchestration.resources import BinlakeResource

    pipeline = parse_config({
        "kafka": {"bootstrap.servers": bootstrap, "group.id": f"bench-{name}",
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed"},
        "lakehouse": {"path": str(work / "lakehouse"), "database": name},
        "dagster": {"changelog_follow_seconds": follow_seconds,
                    "changelog_poll_seconds": poll_seconds},
        "sources": [{"name": "bench", "topics": topics, "format": "debezium",
                     "tables": [{"source": "shop.orders", "replica": "orders"}]}],
    })
    (work / "binlake.yaml").write_text(pipeline.model_dump_json(exclude_none=True))
    home = work / "dagster"
    home.mkdir()
    shutil.copy(REPO_ROOT / "setup" / "dagster.yaml", home / "dagster.yaml")
    return FollowerLocation(pipeline, BinlakeResource(config_path=str(work / "binlake.yaml")),
                            home)
