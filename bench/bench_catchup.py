"""Catch-up (E3): a Debezium backlog over many topics -> changelog + replicas, end to end,
beside the Spark job a Spark engineer would write instead (the anchor).

A backlog of `--events` Debezium change events (default 100,000) spread at random over
`--topics` topics (10), one table per topic as the MySQL connector writes them (topic
`bench.shop.t<i>` carries table `shop.t<i>`, one partition each), no snapshot: each
table's `--keys-per-table` ids (2,000: about 5 changes per key at the default size, 10 in
the full variant) are created, updated and deleted (an absent key gets a create, a live
one an update, or a delete one time in four: 20% c / 60% u / 20% d once a table has
filled up, 33/50/17 at the default size), with real before-images and positions rising
through the whole stream (one MySQL server; the file rotates every 200,000 events).
Schema-less envelopes of ~480 B, keyed by the primary key's JSON.

Phase 1, a fresh lake. binlake, timed end to end from this process: (1)
`consume_partitions` over every topic-partition (what one Dagster run of the changelog
asset does for them, without Dagster: bounded runs, 4 partitions at a time, and for a
backlog this size partitions handed to a worker process per core beyond the first; the
changelog written with delta-rs); (2) Spark start (`get_spark`, the embedded Hive
catalog's first use, which would otherwise fall in the first apply, `ReplicaBuilder`);
(3) `ReplicaBuilder.apply` of every replica, `spark.parallel_replicas` at a time with a
builder each, as the replicas asset applies them (`--parallel-replicas 1`: one after
another; the Spark jobs of each counted). One replica per table (`shop.t<i>` -> `t<i>`),
as most Debezium users configure them; the product's defaults everywhere (Spark
`local[2]`, 2g driver).
The baseline, in the same run and before binlake: (a) a raw batch consume of the same
messages (one consumer, every partition assigned, `consume(num_messages=1000)` to the
end offsets, no decoding) plus (b) a plain Delta write (deltalake `write_deltalake`, one
commit per table) of the final rows, which the generator computed while producing and
which are staged as Arrow tables (arro3) beforehand: what moving the bytes and storing the
result costs when nobody has to work the result out.
The anchor (`anchor_spark.py`, `--no-anchor` leaves it out), after binlake: the batch
Spark job one would write instead, in a process of its own with the product's Spark
settings (the same master, driver memory, Delta jars, class archive; Spark's Kafka
source from `.cache/jars/spark-kafka` beside them): its Spark start, one
`spark.read.format("kafka")` of every topic (earliest to latest) with `from_json` of the
envelopes and the last event per key by Kafka offset (`max_by`, cached), then a Delta
table per table by path (a CTAS of the live rows, deletes dropped),
`spark.parallel_replicas` at a time. No changelog, no position guard, no exactly-once.

Phase 2, existing replicas (`--update-events` per table, default 1,000, at most 1,000; 0
skips it): a second backlog of updates and deletes only (a delete one time in four), on
keys live after phase 1, produced onto the same topics with positions rising on. binlake
runs `consume_partitions` again (the same group: it goes on from phase 1's offsets) and
`ReplicaBuilder.apply` of every replica, `spark.parallel_replicas` at a time (MERGE or
rewrite, as the product decides); the anchor reads the topics from phase 1's end offsets
to their ends, reduces as before and MERGEs the last change per key into each of its
tables (update when matched and not a delete, delete when matched and a delete, insert
when not matched and not a delete). Both sides keep their warm driver from phase 1, as
they keep their JVM from phase 1 (no Spark start in phase 2).

`--follow`: phase 1 as the shipped automation runs a catch-up (`catchup_follow.py`): the
replica follower's loop applies the replicas while the consume writes the changelog,
Spark starting beside it; the anchor as above; no phase 2. Each part's host CPU seconds
(`/proc/stat`) are printed with its wall time, and what a perfect overlap on the host's
cores would still take.

After each phase, before any figure is printed, every replica's live rows
(`<db>.t<i>_current`) and every anchor table (read with delta-rs) must equal the
generator's live rows: count, and the sum over rows of the CRC-32 of their ids and values.
Printed: the 1-minute load average at the start and the end; phase 1's seconds per phase,
binlake events/s, baseline seconds and binlake/baseline (target <= 2); per phase binlake
(consume, Spark start, applies) against the anchor (Spark start, Kafka read + parse +
reduce, writes with their median per table) and binlake / anchor (target <= 0.5); for
phase 2 also binlake's apply wall time per replica (target <= 0.15 s).

    .venv/bin/python bench/bench_catchup.py                                  # 100,000 over 10
    .venv/bin/python bench/bench_catchup.py --events 1000000 --topics 50     # full variant
    .venv/bin/python bench/bench_catchup.py --events 1000000 --topics 50 --follow

The anchor needs `.cache/jars/spark-kafka` (`setup/maven/spark-kafka/pom.xml`), which
`make bench` and `make bench-catchup` resolve.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path

from arro3.core import Array, DataType, Field, Schema, Table
from catchup_follow import binlake_following, busy_seconds
from confluent_kafka import Consumer, TopicPartition
from deltalake import DeltaTable, write_deltalake
from harness import (
    group_id,
    kafka_conf,
    load_average,
    plain_consumer,
    produce_records,
    rate,
    running_broker,
    serial_batches,
    warm_group_coordinator,
)
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.dev.kafka import create_topics
from binlog_assets.environment import cache_dir
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.lakehouse.spark import get_spark, spark_conf
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.orchestration.partitions import partition_key
from binlog_assets.rounds.partition import SinkTotals
from binlog_assets.rounds.round import PARTITIONS_IN_PARALLEL, consume_partitions

TARGET_BINLAKE_VS_BASELINE = 2.0
TARGET_BINLAKE_VS_ANCHOR = 0.5
TARGET_COST_PER_REPLICA = 0.15  # seconds of phase 2's apply wall time per replica
MAX_UPDATE_EVENTS = 1_000  # per table in phase 2
DATABASE = "catchup"
BATCH = 1000  # consume(num_messages=...) of the raw baseline, binlake's default batch
EVENTS_PER_FILE = 200_000  # binlog rotation
DELETE_SHARE = 0.25  # of the changes to a live row
_BASE_TS = 1_795_000_000_000
ANCHOR_SCRIPT = Path(__file__).with_name("anchor_spark.py")

_ROW = (b'{"id":%d,"customer_id":%d,"status":"%s","amount":"%d.%02d","qty":%d,'
        b'"updated_at":%d}')
_SOURCE = (b'"source":{"version":"2.7.3.Final","connector":"mysql","name":"bench",'
           b'"ts_ms":%d,"snapshot":"false","db":"shop","sequence":null,"table":"t%d",'
           b'"server_id":223344,"gtid":null,"file":"mysql-bin.%06d","pos":%d,"row":0,'
           b'"thread":7,"query":null}')
_ENVELOPE = b'{"before":%s,"after":%s,%s,"op":"%s","ts_ms":%d,"transaction":null}'
_STATUSES = (b"pending", b"paid", b"shipped", b"delivered", b"cancelled")
COLUMNS = ("id", "customer_id", "status", "amount", "qty", "updated_at")
ARROW_SCHEMA = Schema([Field(name, kind, nullable=True) for name, kind in (
    ("id", DataType.int64()), ("customer_id", DataType.int64()),
    ("status", DataType.string()), ("amount", DataType.string()),
    ("qty", DataType.int64()), ("updated_at", DataType.int64()))])

# A live row: (customer_id, status index, amount in cents, qty, updated_at).
Row = tuple[int, int, int, int, int]


def topic_name(table: int) -> str:
    return f"bench.shop.t{table}"


@dataclass
class Workload:
    """What the generator produced: per table its live rows now and its records (the
    topic's end offset), the events produced so far and the binlog position."""

    topics: int
    live: list[dict[int, Row]] = field(default_factory=list)
    records: list[int] = field(default_factory=list)
    ops: Counter = field(default_factory=Counter)  # of the last phase produced
    payload_bytes: int = 0  # of the last phase produced
    events: int = 0
    pos: int = 4

    def __post_init__(self) -> None:
        self.live = [{} for _ in range(self.topics)]
        self.records = [0] * self.topics

    @property
    def final_rows(self) -> int:
        return sum(len(rows) for rows in self.live)

    def expected(self, table: int) -> tuple[int, int]:
        """(live rows, sum of CRC-32 of `id|customer_id|status|amount|qty|updated_at`)."""
        total = 0
        for ident, (customer, status, cents, qty, ts) in self.live[table].items():
            text = (f"{ident}|{customer}|{_STATUSES[status].decode()}|{cents // 100}."
                    f"{cents % 100:02d}|{qty}|{ts}")
            total += zlib.crc32(text.encode())
        return len(self.live[table]), total

    def arrow(self, table: int) -> Table:
        """The table's final rows, as the baseline writes them (the replica's types)."""
        rows = self.live[table]
        ids = list(rows)
        values = list(rows.values())
        int64, string = DataType.int64(), DataType.string()
        return Table.from_arrays([
            Array(ids, int64),
            Array([v[0] for v in values], int64),
            Array([_STATUSES[v[1]].decode() for v in values], string),
            Array([f"{v[2] // 100}.{v[2] % 100:02d}" for v in values], string),
            Array([v[3] for v in values], int64),
            Array([v[4] for v in values], int64),
        ], schema=ARROW_SCHEMA)

    def envelope(self, table: int, ident: int, op: bytes, before: bytes, after: bytes
                 ) -> tuple[int, bytes, bytes]:
        """The next event of the stream (its position, time and counts) as a record."""
        i = self.events
        self.events += 1
        ts = _BASE_TS + i
        if i % EVENTS_PER_FILE == 0:
            self.pos = 4
        self.pos += 180 + (i % 7) * 40
        source = _SOURCE % (ts, table, 1 + i // EVENTS_PER_FILE, self.pos)
        self.ops[op.decode()] += 1
        self.records[table] += 1
        return table, b'{"id":%d}' % ident, _ENVELOPE % (before, after, source, op, ts + 7)


def _image(ident: int, row: Row) -> bytes:
    customer, status, cents, qty, ts = row
    return _ROW % (ident, customer, _STATUSES[status], cents // 100, cents % 100, qty, ts)


def _updated(current: Row, randrange, ts: int) -> Row:  # Random.randrange
    customer, status, cents, qty, _ts = current
    return (customer, (status + 1) % len(_STATUSES), max(1, cents + randrange(-99, 100)),
            1 + randrange(9), ts)


def catchup_records(work: Workload, events: int, keys: int, seed: int
                    ) -> Iterator[tuple[int, bytes, bytes]]:
    """(table, key, value): `events` Debezium envelopes over `work.topics` tables, keeping
    `work.live` as the source tables would be after each one."""
    rng = random.Random(seed)
    randrange, chance = rng.randrange, rng.random
    topics, live = work.topics, work.live
    for _ in range(events):
        table = randrange(topics)
        ident = randrange(keys)
        ts = _BASE_TS + work.events
        rows = live[table]
        current = rows.get(ident)
        if current is None:
            op = b"c"
            row = (randrange(100_000), 0, randrange(100, 100_000), 1 + randrange(9), ts)
            rows[ident] = row
            before, after = b"null", _image(ident, row)
        elif chance() < DELETE_SHARE:
            op = b"d"
            del rows[ident]
            before, after = _image(ident, current), b"null"
        else:
            op = b"u"
            row = _updated(current, randrange, ts)
            rows[ident] = row
            before, after = _image(ident, current), _image(ident, row)
        yield work.envelope(table, ident, op, before, after)


def update_records(work: Workload, per_table: int, seed: int
                   ) -> Iterator[tuple[int, bytes, bytes]]:
    """(table, key, value): `per_table` updates and deletes of each table (a delete one
    time in four), in a random order over the tables, each on a key live at that point
    (so live after the previous phase: no creates), positions going on from there."""
    rng = random.Random(seed + 1)
    randrange, chance = rng.randrange, rng.random
    deck = [t for t in range(work.topics) for _ in range(per_table)]
    rng.shuffle(deck)
    keys = [list(rows) for rows in work.live]  # each table's live keys, for a fair pick
    for table in deck:
        rows, live_keys = work.live[table], keys[table]
        if not live_keys:
            continue  # a table emptied by its deletes: nothing left to change
        at = randrange(len(live_keys))
        ident = live_keys[at]
        current = rows[ident]
        if chance() < DELETE_SHARE:
            op = b"d"
            del rows[ident]
            live_keys[at] = live_keys[-1]
            live_keys.pop()
            before, after = _image(ident, current), b"null"
        else:
            op = b"u"
            row = _updated(current, randrange, _BASE_TS + work.events)
            rows[ident] = row
            before, after = _image(ident, current), _image(ident, row)
        yield work.envelope(table, ident, op, before, after)


def produce(bootstrap: str, work: Workload, records: Iterator[tuple[int, bytes, bytes]],
            label: str) -> int:
    """Produce a phase's backlog; fails unless every topic ends where the generator says.
    Returns the phase's record count."""
    work.ops, before = Counter(), work.events
    names = [topic_name(t) for t in range(work.topics)]
    work.payload_bytes, seconds = produce_records(
        bootstrap, ((names[table], key, value) for table, key, value in records))
    ends = end_offsets(bootstrap, names)
    if ends != work.records:
        raise RuntimeError(f"topics end at {ends}, expected {work.records}")
    events = work.events - before
    print(f"{label}: produced {events:,} records (mean {work.payload_bytes / events:.0f} B) "
          f"over {work.topics} topics in {seconds:.1f}s ({rate(events, seconds):,.0f}/s); "
          f"ops {dict(sorted(work.ops.items()))}; {work.final_rows:,} live rows after it",
          flush=True)
    return events


def end_offsets(bootstrap: str, names: list[str]) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(n, 0), timeout=30,
                                               cached=False)[1] for n in names]
    finally:
        consumer.close()


# -- the baseline ---------------------------------------------------------------------


def raw_consume(bootstrap: str, names: list[str], total: int) -> float:
    """Seconds to read every partition from the start to its end, no decoding."""
    began = time.perf_counter()
    consumer = plain_consumer(bootstrap, "raw")
    try:
        for _batch in serial_batches(consumer, [TopicPartition(n, 0, 0) for n in names], total,
                                     BATCH):
            pass
    finally:
        consumer.close()
    return time.perf_counter() - began


def plain_write(root: str, tables: list[Table]) -> float:
    """Seconds to write each table's final rows as a new Delta table, one commit each."""
    began = time.perf_counter()
    for i, table in enumerate(tables):
        write_deltalake(os.path.join(root, f"t{i}"), table)
    return time.perf_counter() - began


# -- binlake --------------------------------------------------------------------------


def pipeline_config(bootstrap: str, lake: str, topics: int) -> PipelineConfig:
    return parse_config({
        "kafka": kafka_conf(bootstrap),
        "lakehouse": {"path": lake, "database": DATABASE},
        "sources": [{
            "name": "shop", "format": "debezium",
            "topics": [topic_name(t) for t in range(topics)],
            "tables": [{"source": f"shop.t{t}", "replica": f"t{t}"} for t in range(topics)],
        }],
    })


@dataclass
class Phases:
    consume: float
    spark_start: float
    applies: list[float]
    apply_wall: float  # the applies side by side, as the replicas asset runs them
    changelog_rows: int
    written: int
    changelog_version: int  # the changelog's commits: one per partition and commit point
    jobs: list[int]  # Spark jobs of each apply
    in_workers: int = 0  # partitions consumed by worker processes
    busy: tuple[float, ...] = ()  # host CPU seconds of the consume, Spark start, applies

    @property
    def total(self) -> float:
        return self.consume + self.spark_start + self.apply_wall


def binlake(pipeline: PipelineConfig, work: Workload, phase_records: list[int], parallel: int,
            group: str, spark: SparkSession | None = None) -> tuple[Phases, SparkSession]:
    """Consume every partition into the changelog (up to the topics' ends), start Spark
    unless `spark` is the warm one, apply every replica (each must read
    `phase_records[t]` changelog rows), `parallel` at a time, each with a builder of its
    own (the replicas asset's way)."""
    keys = [partition_key(topic_name(t), 0) for t in range(work.topics)]
    marks = [busy_seconds()]
    began = time.perf_counter()
    # No handlers given: the source's (none here) are opened where each partition runs,
    # as in the asset, which may hand partitions to worker processes.
    outcomes = consume_partitions(pipeline, dict(pipeline.kafka), keys, ChangelogRunConfig(),
                                  group=group)
    consumed = time.perf_counter()
    marks.append(busy_seconds())
    failed = [o for o in outcomes if o.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} partitions failed, first {failed[0].key}: "
                           f"{failed[0].error!r}") from failed[0].error
    for t, outcome in enumerate(outcomes):
        if outcome.summary.committed_offset != work.records[t]:
            raise RuntimeError(f"{outcome.key} committed {outcome.summary.committed_offset}, "
                               f"expected {work.records[t]}")
    rows = sum(o.sink.rows for o in outcomes)
    in_workers = sum(isinstance(o.sink, SinkTotals) for o in outcomes)
    version = max(o.sink.version for o in outcomes if o.sink.version is not None)

    if spark is None:
        spark = get_spark(pipeline)
        # The Hive catalog (embedded Derby) starts at its first use, which would
        # otherwise be in the first apply: it is counted here, with the JVM and the session.
        spark.catalog.tableExists(f"{DATABASE}.changelog")
    started = time.perf_counter()
    marks.append(busy_seconds())
    context = spark.sparkContext
    tracker = context.statusTracker()

    def apply(t: int) -> tuple[float, int, int]:
        group = f"bench-apply-t{t}-{version}"
        context.setJobGroup(group, group)  # a local property: this thread's jobs
        a = time.perf_counter()
        result = ReplicaBuilder(spark, pipeline).apply(f"t{t}")
        seconds = time.perf_counter() - a
        context.setLocalProperty("spark.jobGroup.id", None)
        if result.skipped or result.rows != phase_records[t]:
            raise RuntimeError(f"replica t{t}: {result}, expected {phase_records[t]} rows")
        return seconds, len(tracker.getJobIdsForGroup(group)), result.written

    with ThreadPoolExecutor(parallel, thread_name_prefix="replica") as pool:
        done = list(pool.map(apply, range(work.topics)))
    applied = time.perf_counter()
    marks.append(busy_seconds())
    return Phases(consumed - began, started - consumed, [d[0] for d in done],
                  applied - started, rows, sum(d[2] for d in done), version,
                  [d[1] for d in done], in_workers,
                  tuple(b - a for a, b in zip(marks, marks[1:], strict=False))), spark


VERIFY_SLICE = 50  # replicas checked in one Spark query


def verify(spark: SparkSession, work: Workload) -> None:
    """Each replica's live rows are the live rows: count and CRC-32 sum, all at once."""
    spark = spark.newSession()
    text = F.concat_ws("|", *[F.col(c).cast("string") for c in COLUMNS]).cast("binary")
    got = {}
    # In slices: Spark's analysis of one union grows faster than its width (500 views in
    # one query had not been planned after 12 minutes).
    for first in range(0, work.topics, VERIFY_SLICE):
        frames = [spark.table(f"{DATABASE}.t{t}_current")
                  .select(F.lit(t).alias("t"), F.crc32(text).alias("crc"))
                  for t in range(first, min(first + VERIFY_SLICE, work.topics))]
        got |= {r["t"]: (r["n"], r["crc"])
                for r in reduce(lambda a, b: a.unionByName(b), frames)
                .groupBy("t").agg(F.count(F.lit(1)).alias("n"), F.sum("crc").alias("crc"))
                .collect()}
    wrong = [(t, got.get(t, (0, 0)), work.expected(t)) for t in range(work.topics)
             if got.get(t, (0, 0)) != work.expected(t)]
    if wrong:
        raise RuntimeError(f"{len(wrong)} replicas differ from the live rows, "
                           f"(table, (rows, crc) got, expected): {wrong[:3]}")


# -- the anchor -----------------------------------------------------------------------


def spark_kafka_jars() -> list[str]:
    path = cache_dir() / "jars" / "spark-kafka"
    jars = sorted(str(p) for p in path.glob("*.jar"))
    if not jars:
        raise SystemExit(f"no jars in {path}: run `make bench-catchup` (it resolves "
                         "setup/maven/spark-kafka/pom.xml), or pass --no-anchor")
    return jars


@dataclass
class AnchorPhase:
    spark_start: float
    read: float  # Kafka read + parse + reduce (cached)
    keys: int  # keys after the reduce
    write_wall: float
    writes: list[float]
    round_trip: float  # the command as the parent saw it
    opened_catalog: bool  # by the end of the phase

    @property
    def total(self) -> float:
        return self.spark_start + self.read + self.write_wall


class Anchor:
    """`anchor_spark.py` in a process of its own: the product's Spark settings for a lake
    of its own (its Derby catalog, should Spark open it, and warehouse there), plus
    Spark's Kafka source; its tables are Delta tables by path under `<lake>/tables`."""

    def __init__(self, bootstrap: str, lake: str, topics: int, parallel: int) -> None:
        conf = spark_conf(pipeline_config(bootstrap, lake, topics))
        conf["spark.app.name"] = "anchor"
        conf["spark.jars"] = ",".join([conf["spark.jars"], *spark_kafka_jars()])
        Path(lake).mkdir(parents=True, exist_ok=True)
        self.lake, self.bootstrap, self.parallel = lake, bootstrap, parallel
        self.topics = [topic_name(t) for t in range(topics)]
        self.paths = [os.path.join(lake, "tables", f"t{t}") for t in range(topics)]
        self.process = subprocess.Popen([sys.executable, str(ANCHOR_SCRIPT)], text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._ask(conf)

    def _ask(self, command: dict) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the anchor exited ({self.process.wait()})")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the anchor failed: {answer['error']}")
        return answer

    def phase(self, mode: str, starting: str | dict, ending: str | dict) -> AnchorPhase:
        began = time.perf_counter()
        a = self._ask({"cmd": "phase", "mode": mode, "bootstrap": self.bootstrap,
                       "topics": self.topics, "paths": self.paths, "starting": starting,
                       "ending": ending, "parallel": self.parallel})
        return AnchorPhase(a["spark_start"], a["read"], a["keys"], a["write_wall"],
                           a["writes"], time.perf_counter() - began, self.opened_catalog)

    @property
    def opened_catalog(self) -> bool:
        """Whether its Spark opened the Hive catalog (embedded Derby), which nothing it
        does needs: its tables are paths."""
        return os.path.isdir(os.path.join(self.lake, "metastore_db"))

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"cmd": "stop"}) + "\n")
                self.process.stdin.close()
                self.process.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()

    def verify(self, work: Workload) -> None:
        """Each anchor table (read with delta-rs) holds the live rows: count, CRC-32 sum."""
        wrong = []
        for t, path in enumerate(self.paths):
            columns = DeltaTable(path).to_pyarrow_table(columns=list(COLUMNS)).to_pydict()
            crc = sum(zlib.crc32("|".join(map(str, values)).encode())
                      for values in zip(*(columns[c] for c in COLUMNS), strict=True))
            got = (len(columns["id"]), crc)
            if got != work.expected(t):
                wrong.append((t, got, work.expected(t)))
        if wrong:
            raise RuntimeError(f"{len(wrong)} anchor tables differ from the live rows, "
                               f"(table, (rows, crc) got, expected): {wrong[:3]}")


def offsets(names: list[str], ends: list[int]) -> dict:
    """Kafka source offsets (`{"topic": {"0": offset}}`) of partition 0 of each topic."""
    return {name: {"0": end} for name, end in zip(names, ends, strict=True)}


# -- the report -----------------------------------------------------------------------


def follow_against_anchor(args: argparse.Namespace, followed: object, work: Workload,
                          bootstrap: str, lake: str, parallel: int) -> None:
    """Phase 1 with the follower: the anchor on the same topics, both sides verified, the
    ratio printed."""
    anchor = Anchor(bootstrap, os.path.join(lake, "anchor"), args.topics, parallel)
    try:
        busy = busy_seconds()
        phase = anchor.phase("create", "earliest", "latest")
        busy = busy_seconds() - busy
        verify(get_spark(pipeline_config(bootstrap, os.path.join(lake, "lake"),
                                          args.topics)), work)
        anchor.verify(work)
    finally:
        anchor.close()
    ratio = followed.total / phase.total
    verdict = "meets" if ratio <= TARGET_BINLAKE_VS_ANCHOR else "MISSES"
    cores = os.cpu_count() or 1
    print(f"phase 1 with the follower, {args.events:,} events over {args.topics} topics; "
          f"replicas and anchor tables verified\n  binlake {followed.line()}\n  anchor "
          f"{phase.total:.2f}s (Spark start {phase.spark_start:.2f}s, read "
          f"{phase.read:.2f}s, writes {phase.write_wall:.2f}s); host busy {busy:.1f} CPU s "
          f"as the parent measured it\nbinlake / anchor = {ratio:.2f} ({verdict} target <= "
          f"{TARGET_BINLAKE_VS_ANCHOR}); binlake's host CPU s / {cores} cores = "
          f"{followed.busy / cores:.1f}s, {followed.busy / cores / phase.total:.2f} of the "
          f"anchor\nat the end: {load_average()}")


def versus(label: str, phases: Phases, anchor: AnchorPhase | None, parallel: int,
           topics: int) -> None:
    """binlake against the anchor for one phase."""
    print(f"{label}: binlake {phases.total:.2f}s (consume {phases.consume:.2f}s, Spark start "
          f"{phases.spark_start:.2f}s, applies {phases.apply_wall:.2f}s)")
    if anchor is None:
        return
    print(f"{label}: anchor  {anchor.total:.2f}s (Spark start {anchor.spark_start:.2f}s, "
          f"Kafka read + parse + reduce {anchor.read:.2f}s to {anchor.keys:,} keys, "
          f"writes {anchor.write_wall:.2f}s: {topics} tables {parallel} at a time, median "
          f"{statistics.median(anchor.writes):.2f}s per table, min {min(anchor.writes):.2f}, "
          f"max {max(anchor.writes):.2f}; {anchor.round_trip:.2f}s as the parent saw it; "
          f"Hive catalog {'opened' if anchor.opened_catalog else 'never opened'})")
    ratio = phases.total / anchor.total
    verdict = "meets" if ratio <= TARGET_BINLAKE_VS_ANCHOR else "MISSES"
    print(f"{label}: binlake / anchor = {ratio:.2f} ({verdict} target <= "
          f"{TARGET_BINLAKE_VS_ANCHOR}); applies / anchor writes "
          f"{phases.apply_wall / anchor.write_wall:.2f}; consume / anchor read "
          f"{phases.consume / anchor.read:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--topics", type=int, default=10, help="topics, one table each")
    parser.add_argument("--keys-per-table", type=int, default=2_000,
                        help="distinct primary keys of each table")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--heap", default="1g", help="broker JVM heap")
    parser.add_argument("--parallel-replicas", type=int, default=None,
                        help="replicas applied at once, and anchor tables written at once "
                             "(default: the product's spark.parallel_replicas)")
    parser.add_argument("--anchor", action=argparse.BooleanOptionalAction, default=True,
                        help="run the Spark job one would write instead, side by side")
    parser.add_argument("--follow", action="store_true",
                        help="phase 1 as the shipped automation runs it: the replica "
                             "follower applies while the consume runs (no phase 2)")
    parser.add_argument("--update-events", type=int, default=MAX_UPDATE_EVENTS,
                        help="phase 2: updates and deletes per table on existing replicas "
                             f"(at most {MAX_UPDATE_EVENTS:,}; 0: no phase 2)")
    args = parser.parse_args()
    if not 0 <= args.update_events <= MAX_UPDATE_EVENTS:
        parser.error(f"--update-events must be 0 to {MAX_UPDATE_EVENTS:,}")
    if args.anchor:
        spark_kafka_jars()  # fail now, not after the binlake side

    print(f"at the start: {load_average()}", flush=True)
    lake = tempfile.mkdtemp(prefix="binlake-bench-catchup-")
    anchor: Anchor | None = None
    anchor1 = anchor2 = phases2 = None
    try:
        with running_broker(args.heap) as broker:
            bootstrap = broker.bootstrap_servers
            names = [topic_name(t) for t in range(args.topics)]
            create_topics(bootstrap, names)
            warm_group_coordinator(bootstrap, names[0])
            work = Workload(args.topics)
            produce(bootstrap, work, catchup_records(work, args.events, args.keys_per_table,
                                                     args.seed), "phase 1")

            staged = [work.arrow(t) for t in range(args.topics)]
            consume_s = raw_consume(bootstrap, names, args.events)
            write_s = plain_write(os.path.join(lake, "baseline"), staged)
            print(f"baseline: raw consume {consume_s:.2f}s + plain Delta write "
                  f"{write_s:.2f}s; {load_average()}", flush=True)

            pipeline = pipeline_config(bootstrap, os.path.join(lake, "lake"), args.topics)
            parallel = args.parallel_replicas or pipeline.spark.parallel_replicas
            group = group_id("binlake")
            if args.follow:
                followed = binlake_following(
                    pipeline, [partition_key(topic_name(t), 0) for t in range(args.topics)],
                    {f"t{t}": n for t, n in enumerate(work.records)}, parallel, group)
                print(f"binlake with its follower: {followed.line()}; {load_average()}",
                      flush=True)
                follow_against_anchor(args, followed, work, bootstrap, lake, parallel)
                return
            phases, spark = binlake(pipeline, work, list(work.records), parallel, group)
            print(f"binlake: consume {phases.consume:.2f}s, Spark start "
                  f"{phases.spark_start:.2f}s, apply {phases.apply_wall:.2f}s; "
                  f"{load_average()}", flush=True)
            if args.anchor:
                anchor = Anchor(bootstrap, os.path.join(lake, "anchor"), args.topics,
                                parallel)
                anchor1 = anchor.phase("create", "earliest", "latest")
                print(f"anchor: Spark start {anchor1.spark_start:.2f}s, read "
                      f"{anchor1.read:.2f}s, writes {anchor1.write_wall:.2f}s; "
                      f"{load_average()}", flush=True)
            verify(spark, work)
            if anchor is not None:
                anchor.verify(work)
            final_rows1, ends1 = work.final_rows, list(work.records)

            if args.update_events:
                updates = produce(bootstrap, work, update_records(
                    work, args.update_events, args.seed), "phase 2")
                phase_records = [end - start for end, start in zip(
                    work.records, ends1, strict=True)]
                phases2, _ = binlake(pipeline, work, phase_records, parallel, group, spark)
                print(f"binlake phase 2: consume {phases2.consume:.2f}s, apply "
                      f"{phases2.apply_wall:.2f}s; {load_average()}", flush=True)
                if anchor is not None:
                    anchor2 = anchor.phase("merge", offsets(names, ends1), "latest")
                    print(f"anchor phase 2: read {anchor2.read:.2f}s, merges "
                          f"{anchor2.write_wall:.2f}s; {load_average()}", flush=True)
                verify(spark, work)
                if anchor is not None:
                    anchor.verify(work)
    finally:
        if anchor is not None:
            anchor.close()
        shutil.rmtree(lake, ignore_errors=True)

    baseline = consume_s + write_s
    ratio = phases.total / baseline
    verdict = "meets" if ratio <= TARGET_BINLAKE_VS_BASELINE else "MISSES"
    rest = phases.applies[1:]
    print(f"\nphase 1, a fresh lake: {args.events:,} events over {args.topics} topics "
          f"({args.keys_per_table:,} keys per table, one replica per table) -> "
          f"{phases.changelog_rows:,} changelog rows in {phases.changelog_version} commits, "
          f"{final_rows1:,} live replica rows ({phases.written:,} rows written by the "
          f"applies); replicas"
          + (" and anchor tables" if anchor1 else "")
          + " verified (count and CRC-32 of ids and values)")
    print(f"{'phase':<38}{'seconds':>9}{'share':>8}{'host CPU s':>12}{'cores':>7}")
    for label, seconds, busy in (
            (f"consume ({PARTITIONS_IN_PARALLEL} at a time, {phases.in_workers} in workers)",
             phases.consume, phases.busy[0]),
            ("Spark start (JVM, session, catalog)", phases.spark_start, phases.busy[1]),
            (f"apply x{args.topics}, {parallel} at a time", phases.apply_wall,
             phases.busy[2]),
            ("binlake total", phases.total, sum(phases.busy))):
        print(f"{label:<38}{seconds:>9.2f}{seconds / phases.total:>8.0%}{busy:>12.1f}"
              f"{busy / seconds:>7.2f}")
    cores = os.cpu_count() or 1
    print(f"  overlapped perfectly on {cores} cores, binlake's phase 1 would still take "
          f"{sum(phases.busy) / cores:.1f}s (host CPU s / cores)")
    print(f"  consume: {rate(args.events, phases.consume):,.0f} events/s; apply: first "
          f"{phases.applies[0]:.2f}s"
          + (f", then median {statistics.median(rest):.2f}s (min {min(rest):.2f}, max "
             f"{max(rest):.2f})" if rest else "")
          + f"; sum {sum(phases.applies):.2f}s; Spark jobs per apply "
          f"{statistics.median(phases.jobs):.0f} (median)")
    print(f"binlake: {rate(args.events, phases.total):,.0f} events/s end to end")
    print(f"baseline: {baseline:.2f}s (raw consume {consume_s:.2f}s "
          f"{rate(args.events, consume_s):,.0f} msgs/s + plain Delta write {write_s:.2f}s)")
    print(f"binlake/baseline = {ratio:.2f} ({verdict} target <= "
          f"{TARGET_BINLAKE_VS_BASELINE}); without Spark start "
          f"{(phases.total - phases.spark_start) / baseline:.2f}")
    versus("phase 1", phases, anchor1, parallel, args.topics)

    if phases2 is not None:
        per_replica = phases2.apply_wall / args.topics
        verdict = "meets" if per_replica <= TARGET_COST_PER_REPLICA else "MISSES"
        print(f"\nphase 2, existing replicas: {updates:,} updates and deletes "
              f"({args.update_events:,} per table) -> {phases2.changelog_rows:,} changelog "
              f"rows, {work.final_rows:,} live rows ({phases2.written:,} rows written by the "
              f"applies, Spark jobs per apply {statistics.median(phases2.jobs):.0f} median); "
              "verified again; both drivers warm from phase 1")
        versus("phase 2", phases2, anchor2, parallel, args.topics)
        print(f"phase 2: binlake's cost per replica = {per_replica:.3f}s (apply wall "
              f"{phases2.apply_wall:.2f}s / {args.topics} replicas; median apply "
              f"{statistics.median(phases2.applies):.2f}s, {parallel} at a time) "
              f"({verdict} target <= {TARGET_COST_PER_REPLICA})")
    print(f"at the end: {load_average()}")


if __name__ == "__main__":
    main()
