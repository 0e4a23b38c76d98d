"""Catch-up (E3): a Debezium backlog over many topics -> changelog + replicas, end to end.

A backlog of `--events` Debezium change events (default 100,000) spread at random over
`--topics` topics (10), one table per topic as the MySQL connector writes them (topic
`bench.shop.t<i>` carries table `shop.t<i>`, one partition each), no snapshot: each
table's `--keys-per-table` ids (2,000: about 5 changes per key at the default size, 10 in
the full variant) are created, updated and deleted (an absent key gets a create, a live
one an update, or a delete one time in four: 20% c / 60% u / 20% d once a table has
filled up, 33/50/17 at the default size), with real before-images and positions rising
through the whole stream (one MySQL server; the file rotates every 200,000 events).
Schema-less envelopes of ~480 B, keyed by the primary key's JSON.

binlake, timed end to end from this process: (1) `consume_partitions` over every
topic-partition (what one Dagster run of the changelog asset does for them, without
Dagster: bounded runs, 4 partitions at a time, and for a backlog this size partitions
handed to a worker process per core beyond the first; the changelog written with delta-rs);
(2) Spark start (`get_spark`, the embedded Hive catalog's first use, which would
otherwise fall in the first apply, `ReplicaBuilder`); (3) `ReplicaBuilder.apply` of every
replica, `spark.parallel_replicas` at a time with a builder each, as the replicas asset
applies them (`--parallel-replicas 1`: one after another; the Spark jobs of each counted).
One replica per table (`shop.t<i>` -> `t<i>`), as most Debezium users configure them;
the product's defaults everywhere (Spark `local[2]`, 2g driver).
The baseline, in the same run and before binlake: (a) a raw batch consume of the same
messages (one consumer, every partition assigned, `consume(num_messages=1000)` to the
end offsets, no decoding) plus (b) a plain Delta write (deltalake `write_deltalake`, one
commit per table) of the final rows, which the generator computed while producing and
which are staged as Arrow tables (arro3) beforehand: what moving the bytes and storing the
result costs when nobody has to work the result out.
Before the ratio is printed, each replica's live rows (`<db>.t<i>_current`) must equal
the final rows: count, and the sum over rows of the CRC-32 of their ids and values.
Printed: each phase's seconds, binlake events/s, baseline seconds and binlake/baseline
(target <= 2).

    .venv/bin/python bench/bench_catchup.py                                  # 100,000 over 10
    .venv/bin/python bench/bench_catchup.py --events 1000000 --topics 50     # full variant
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import reduce

from arro3.core import Array, DataType, Field, Schema, Table
from confluent_kafka import Consumer, TopicPartition
from deltalake import write_deltalake
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
from pyspark.sql import functions as F

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.dev.kafka import create_topics
from binlog_assets.lakehouse.replica import ReplicaBuilder
from binlog_assets.lakehouse.spark import get_spark
from binlog_assets.orchestration.consume_runs import (
    PARTITIONS_IN_PARALLEL,
    ChangelogRunConfig,
    consume_partitions,
)
from binlog_assets.orchestration.consume_workers import SinkTotals
from binlog_assets.orchestration.partitions import partition_key

TARGET_BINLAKE_VS_BASELINE = 2.0
DATABASE = "catchup"
BATCH = 1000  # consume(num_messages=...) of the raw baseline, binlake's default batch
EVENTS_PER_FILE = 200_000  # binlog rotation
DELETE_SHARE = 0.25  # of the changes to a live row
_BASE_TS = 1_795_000_000_000

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
    """What the generator produced: per table its live rows at the end, its records."""

    topics: int
    live: list[dict[int, Row]] = field(default_factory=list)
    records: list[int] = field(default_factory=list)
    ops: Counter = field(default_factory=Counter)
    payload_bytes: int = 0

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


def _image(ident: int, row: Row) -> bytes:
    customer, status, cents, qty, ts = row
    return _ROW % (ident, customer, _STATUSES[status], cents // 100, cents % 100, qty, ts)


def catchup_records(work: Workload, events: int, keys: int, seed: int
                    ) -> Iterator[tuple[int, bytes, bytes]]:
    """(table, key, value): `events` Debezium envelopes over `work.topics` tables, keeping
    `work.live` as the source tables would be after each one."""
    rng = random.Random(seed)
    randrange, chance = rng.randrange, rng.random
    topics, live = work.topics, work.live
    pos = 4
    for i in range(events):
        table = randrange(topics)
        ident = randrange(keys)
        ts = _BASE_TS + i
        if i % EVENTS_PER_FILE == 0:
            pos = 4
        pos += 180 + (i % 7) * 40
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
            customer, status, cents, qty, _ts = current
            row = (customer, (status + 1) % len(_STATUSES), max(1, cents + randrange(-99, 100)),
                   1 + randrange(9), ts)
            rows[ident] = row
            before, after = _image(ident, current), _image(ident, row)
        source = _SOURCE % (ts, table, 1 + i // EVENTS_PER_FILE, pos)
        work.ops[op.decode()] += 1
        work.records[table] += 1
        yield table, b'{"id":%d}' % ident, _ENVELOPE % (before, after, source, op, ts + 7)


def produce(bootstrap: str, events: int, topics: int, keys: int, seed: int) -> Workload:
    """Produce the backlog; fails unless every topic ends where the generator says."""
    work = Workload(topics)
    names = [topic_name(t) for t in range(topics)]
    work.payload_bytes, seconds = produce_records(
        bootstrap, ((names[table], key, value)
                    for table, key, value in catchup_records(work, events, keys, seed)))
    ends = end_offsets(bootstrap, names)
    if ends != work.records:
        raise RuntimeError(f"topics end at {ends}, expected {work.records}")
    print(f"produced {events:,} records (mean {work.payload_bytes / events:.0f} B) over "
          f"{topics} topics in {seconds:.1f}s ({rate(events, seconds):,.0f}/s); ops "
          f"{dict(sorted(work.ops.items()))}; {work.final_rows:,} live rows at the end",
          flush=True)
    return work


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

    @property
    def total(self) -> float:
        return self.consume + self.spark_start + self.apply_wall


def binlake(cfg: PipelineConfig, work: Workload, parallel: int
            ) -> tuple[Phases, ReplicaBuilder]:
    """Consume every partition into the changelog, start Spark, apply every replica,
    `parallel` at a time, each with a builder of its own (the replicas asset's way)."""
    keys = [partition_key(topic_name(t), 0) for t in range(work.topics)]
    group = group_id("binlake")
    began = time.perf_counter()
    # No handlers given: the source's (none here) are opened where each partition runs,
    # as in the asset, which may hand partitions to worker processes.
    outcomes = consume_partitions(cfg, dict(cfg.kafka), keys, ChangelogRunConfig(),
                                  group=group)
    consumed = time.perf_counter()
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

    spark = get_spark(cfg)
    # The Hive catalog (embedded Derby) starts at its first use, which would otherwise be
    # in the first apply: it is counted here, with the JVM and the session.
    spark.catalog.tableExists(f"{DATABASE}.changelog")
    started = time.perf_counter()
    context = spark.sparkContext
    tracker = context.statusTracker()

    def apply(t: int) -> tuple[float, int, int]:
        group = f"bench-apply-t{t}"
        context.setJobGroup(group, group)  # a local property: this thread's jobs
        a = time.perf_counter()
        result = ReplicaBuilder(spark, cfg).apply(f"t{t}")
        seconds = time.perf_counter() - a
        context.setLocalProperty("spark.jobGroup.id", None)
        if result.skipped or result.rows != work.records[t]:
            raise RuntimeError(f"replica t{t}: {result}")
        return seconds, len(tracker.getJobIdsForGroup(group)), result.written

    with ThreadPoolExecutor(parallel, thread_name_prefix="replica") as pool:
        done = list(pool.map(apply, range(work.topics)))
    applied = time.perf_counter()
    return Phases(consumed - began, started - consumed, [d[0] for d in done],
                  applied - started, rows, sum(d[2] for d in done), version,
                  [d[1] for d in done], in_workers), ReplicaBuilder(spark, cfg)


def verify(builder: ReplicaBuilder, work: Workload) -> None:
    """Each replica's live rows are the final rows: count and CRC-32 sum, all at once."""
    spark = builder.spark
    text = F.concat_ws("|", *[F.col(c).cast("string") for c in COLUMNS]).cast("binary")
    frames = [spark.table(f"{DATABASE}.t{t}_current")
              .select(F.lit(t).alias("t"), F.crc32(text).alias("crc"))
              for t in range(work.topics)]
    got = {r["t"]: (r["n"], r["crc"]) for r in reduce(lambda a, b: a.unionByName(b), frames)
           .groupBy("t").agg(F.count(F.lit(1)).alias("n"), F.sum("crc").alias("crc"))
           .collect()}
    wrong = [(t, got.get(t, (0, 0)), work.expected(t)) for t in range(work.topics)
             if got.get(t, (0, 0)) != work.expected(t)]
    if wrong:
        raise RuntimeError(f"{len(wrong)} replicas differ from the final rows, "
                           f"(table, (rows, crc) got, expected): {wrong[:3]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--topics", type=int, default=10, help="topics, one table each")
    parser.add_argument("--keys-per-table", type=int, default=2_000,
                        help="distinct primary keys of each table")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--heap", default="1g", help="broker JVM heap")
    parser.add_argument("--parallel-replicas", type=int, default=None,
                        help="replicas applied at once (default: the product's "
                             "spark.parallel_replicas)")
    args = parser.parse_args()

    lake = tempfile.mkdtemp(prefix="binlake-bench-catchup-")
    try:
        with running_broker(args.heap) as broker:
            bootstrap = broker.bootstrap_servers
            names = [topic_name(t) for t in range(args.topics)]
            create_topics(bootstrap, names)
            warm_group_coordinator(bootstrap, names[0])
            work = produce(bootstrap, args.events, args.topics, args.keys_per_table,
                           args.seed)

            staged = [work.arrow(t) for t in range(args.topics)]
            consume_s = raw_consume(bootstrap, names, args.events)
            write_s = plain_write(os.path.join(lake, "baseline"), staged)
            print(f"baseline: raw consume {consume_s:.2f}s + plain Delta write "
                  f"{write_s:.2f}s; {load_average()}", flush=True)

            cfg = pipeline_config(bootstrap, os.path.join(lake, "lake"), args.topics)
            parallel = args.parallel_replicas or cfg.spark.parallel_replicas
            phases, builder = binlake(cfg, work, parallel)
            print(f"binlake: consume {phases.consume:.2f}s, Spark start "
                  f"{phases.spark_start:.2f}s, apply {phases.apply_wall:.2f}s; "
                  f"{load_average()}", flush=True)
        verify(builder, work)
    finally:
        shutil.rmtree(lake, ignore_errors=True)

    baseline = consume_s + write_s
    ratio = phases.total / baseline
    verdict = "meets" if ratio <= TARGET_BINLAKE_VS_BASELINE else "MISSES"
    rest = phases.applies[1:]
    print(f"\n{args.events:,} events over {args.topics} topics ({args.keys_per_table:,} keys "
          f"per table, one replica per table) -> {phases.changelog_rows:,} changelog rows "
          f"in {phases.changelog_version} commits, "
          f"{work.final_rows:,} live replica rows ({phases.written:,} rows written by the "
          f"applies); replicas verified (count and CRC-32 of ids and values)")
    print(f"{'phase':<38}{'seconds':>9}{'share':>8}")
    for label, seconds in (
            (f"consume ({PARTITIONS_IN_PARALLEL} at a time, {phases.in_workers} in workers)",
             phases.consume),
            ("Spark start (JVM, session, catalog)", phases.spark_start),
            (f"apply x{args.topics}, {parallel} at a time", phases.apply_wall),
            ("binlake total", phases.total)):
        print(f"{label:<38}{seconds:>9.2f}{seconds / phases.total:>8.0%}")
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
    print(f"at the end: {load_average()}")


if __name__ == "__main__":
    main()
