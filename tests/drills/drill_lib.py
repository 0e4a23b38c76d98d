"""Shared pieces of the end-to-end test and the drills on the real source stack.

The shop schema (`binlog_assets.dev.shop`) in the session's MariaDB, captured by the
session's Debezium connector (topic prefix `shop`) into the session's broker: four row
topics and the schema-change topic, one partition each. Every consumer here starts from
offset 0 of those topics under its own group and lakehouse database, so the replicas it
builds must equal the source tables as they are, whatever other tests wrote before.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.dev import shop
from binlog_assets.dev.connect import DebeziumFence
from binlog_assets.dev.demo import wait_for_debezium
from binlog_assets.formats.base import ChangeDecoder
from binlog_assets.formats.debezium import DebeziumDecoder
from binlog_assets.formats.event import ChangeEvent
from binlog_assets.orchestration.partitions import partition_key

PREFIX = "shop"
TOPICS = (PREFIX, *(f"{PREFIX}.{t}" for t in
                    ("shop.customers", "shop.products", "shop_1.orders", "shop_2.orders")))
KEYS = tuple(partition_key(t, 0) for t in TOPICS)
TABLES = [
    {"source": "shop.customers", "replica": "customers"},
    {"source": "shop.products", "replica": "products"},
    {"source": r"shop_\d+\.orders", "replica": "orders"},
]
REPLICAS = tuple(sorted(shop.REPLICAS))


def shop_config(base: PipelineConfig, database: str, *, lakehouse: Path | None = None,
                **source: Any) -> PipelineConfig:
    """The shop pipeline on the session's broker, with its own group and database."""
    data = base.model_dump(mode="json", exclude_none=True)
    data["kafka"]["group.id"] = f"{database}-{uuid.uuid4().hex[:6]}"
    data["lakehouse"] = {**data["lakehouse"], "database": database}
    if lakehouse is not None:
        data["lakehouse"]["path"] = str(lakehouse)
    data["sources"] = [{"name": "shop", "topics": list(TOPICS), "format": "debezium",
                        "tables": TABLES, **source}]
    return parse_config(data)


def workload(conn, seed: int, statements: int) -> int:
    """A seeded random mix (inserts, updates, deletes, re-inserts, key changes), plus
    one of each rarer change: an added column (once per database), a primary-key change,
    and a truncate followed by new rows. Returns the statements run."""
    shop.create_schema(conn)
    rng = random.Random(seed)
    ran = shop.random_workload(conn, seed, statements)
    with conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM information_schema.columns WHERE table_schema="
                    "'shop' AND table_name='customers' AND column_name='tier'")
        if not cur.fetchone()[0]:
            cur.execute("ALTER TABLE shop.customers ADD COLUMN tier VARCHAR(20) NULL")
            ran += 1
        cur.execute("SELECT id FROM shop.customers ORDER BY id LIMIT 3")
        for (cid,) in cur.fetchall():
            cur.execute("UPDATE shop.customers SET tier = %s WHERE id = %s",
                        (rng.choice(["gold", "basic"]), cid))
            ran += 1
        cur.execute("SELECT MIN(id), MAX(id) FROM shop.products")
        low, high = cur.fetchone()
        if low is not None:
            # A primary-key change: Debezium emits a delete of `low` and a create.
            cur.execute("UPDATE shop.products SET id = %s WHERE id = %s",
                        (max(high, 200) + 1, low))
            ran += 1
        cur.execute("TRUNCATE TABLE shop_2.orders")
        for i in range(1, 4):
            cur.execute("INSERT INTO shop_2.orders VALUES (%s, %s, %s, %s, %s, %s)",
                        (i, i, i, i, "new", shop.T0 + timedelta(seconds=rng.randint(0, 9999))))
        ran += 4
    ran += shop.random_workload(conn, seed + 1, statements // 4)
    return ran


def wait_published(kafka_conf: dict, fence: DebeziumFence) -> dict[str, int]:
    """End offsets of the shop topics once Debezium published what MariaDB committed."""
    return wait_for_debezium(kafka_conf, list(TOPICS), fence=fence)


def kafka_model(kafka_conf: dict, ends: dict[str, int]) -> Counter:
    """What the changelog must hold: (topic, partition, offset, row_index) of every event
    the decoder makes of the topics' records below `ends` (Counter: each exactly once)."""
    return Counter((e.topic, e.partition, e.offset, e.row_index)
                   for e in kafka_events(kafka_conf, ends))


def kafka_events(kafka_conf: dict, ends: dict[str, int], decoder: ChangeDecoder | None = None
                 ) -> Iterator[ChangeEvent]:
    """Every event the decoder (Debezium JSON's by default) makes of the topics' records
    below `ends`."""
    consumer = Consumer({**kafka_conf, "group.id": f"model-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    decoder = decoder or DebeziumDecoder()
    decoded = 0
    try:
        for key, end in ends.items():
            topic, partition = key.rsplit(":", 1)
            if end <= 0:
                continue
            consumer.assign([TopicPartition(topic, int(partition), 0)])
            deadline = time.monotonic() + 120
            last = -1
            while last < end - 1 and time.monotonic() < deadline:
                for m in consumer.consume(500, timeout=1.0):
                    if m.error() is not None or m.offset() >= end:
                        continue
                    last = max(last, m.offset())
                    for e in decoder.decode(m.value(), topic=m.topic(), partition=m.partition(),
                                            offset=m.offset(), key=m.key(),
                                            headers=m.headers()):
                        decoded += 1
                        yield e
            assert last >= end - 1 or not decoded, f"{key}: read up to {last}, end {end}"
    finally:
        consumer.close()


def dead_letter_coordinates(kafka_conf: dict, topic: str) -> Counter:
    """(topic, partition, offset) of every record in the dead-letter topic `topic`, from
    its `binlake.*` headers -> records (a record dead-lettered twice counts 2)."""
    consumer = Consumer({**kafka_conf, "group.id": f"dlq-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False})
    out: Counter = Counter()
    try:
        tp = TopicPartition(topic, 0, 0)
        _low, high = consumer.get_watermark_offsets(tp, timeout=30, cached=False)
        if high <= 0:
            return out
        consumer.assign([tp])
        deadline = time.monotonic() + 120
        last = -1
        while last < high - 1 and time.monotonic() < deadline:
            for m in consumer.consume(500, timeout=1.0):
                if m.error() is not None:
                    continue
                last = max(last, m.offset())
                h = {k: v.decode() for k, v in m.headers() or () if k.startswith("binlake.")}
                out[(h["binlake.topic"], int(h["binlake.partition"]),
                     int(h["binlake.offset"]))] += 1
        assert last >= high - 1, f"{topic}: read up to {last}, end {high}"
    finally:
        consumer.close()
    return out


COORDINATES = ("topic", "partition", "offset", "row_index")


def changelog_coordinates(frame) -> Counter:
    """(topic, partition, offset, row_index) -> rows, of a changelog DataFrame, or of the
    changelog table at a path (read by delta-rs: no Spark job)."""
    if isinstance(frame, str | Path):
        from deltalake import DeltaTable

        table = DeltaTable(str(frame)).to_pyarrow_table(columns=list(COORDINATES))
        return Counter(zip(*(table.column(c).to_pylist() for c in COORDINATES),
                           strict=True))
    rows = frame.groupBy(*COORDINATES).count().collect()
    return Counter({tuple(r[c] for c in COORDINATES): r["count"] for r in rows})


def coordinate_diff(expected: Counter, got: Counter) -> dict[str, int]:
    """Events missing from the changelog, unexpected ones, and duplicates."""
    return {
        "missing": sum(1 for k in expected if k not in got),
        "unexpected": sum(1 for k in got if k not in expected),
        "duplicates": sum(n - 1 for n in got.values() if n > 1),
    }


def seeded_build(pipeline: PipelineConfig, mariadb, fence: DebeziumFence, seed: int,
                 statements: int, workdir: Path) -> tuple[int, list, float, dict]:
    """The seeded workload through Debezium and one consumer run per shop partition
    (in this process: no Spark), then the replica build and its comparison with MariaDB
    in a child process (`build_child.py`: the Spark the config names); returns the
    statements run, the runs' summaries, the consume seconds and the child's result."""
    import json
    import subprocess
    import sys

    import yaml

    from binlog_assets.consume.handlers import HandlerRegistry
    from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
    from binlog_assets.rounds.round import consume_partition

    config_path = workdir / "binlake.yaml"
    config_path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_none=True)))
    kafka_conf = dict(pipeline.kafka)
    ran = workload(mariadb.connect(), seed, statements)
    ends = wait_published(kafka_conf, fence)
    began = time.monotonic()
    summaries = [consume_partition(pipeline, kafka_conf, key, ChangelogRunConfig(),
                                   HandlerRegistry(), group=pipeline.kafka["group.id"])[0]
                 for key in KEYS]
    consume_seconds = time.monotonic() - began
    assert [s.committed_offset for s in summaries] == [ends[k] for k in KEYS]
    child = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("build_child.py")), str(config_path),
         str(mariadb.data_dir)],
        capture_output=True, text=True, timeout=900)
    lines = [ln for ln in child.stdout.splitlines() if ln.startswith("BUILD-RESULT ")]
    assert child.returncode == 0 and lines, child.stderr[-4000:]
    return ran, summaries, consume_seconds, json.loads(lines[0].split(" ", 1)[1])
