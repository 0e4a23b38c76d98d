"""L1: a big table's way in. binlake's initial load (chunks read in parallel, each in its
own consistent snapshot, into the changelog and straight into the replica) beside the plain
Spark job a data engineer would write instead (`spark.read.jdbc` partitioned over the
key, a Delta write by path, no consistency), on the same table in one run.

A fresh MariaDB (its own data directory, a 1 GiB buffer pool) holds `bench.wide` with
`--rows` rows (default 2,000,000) of 12 mixed columns (BIGINT key, INT, INT, VARCHAR,
DECIMAL(12,2), DATETIME(3), nullable VARCHAR, SMALLINT, DOUBLE, DATE, TINYINT, CHAR(8)),
made by MariaDB's sequence engine and read once before timing (the buffer pool warm for
both sides).

Timed, each side in turn (`--order` says which first):

- the Spark copy, in a process of its own: the product's Spark settings (master, driver
  memory, Delta jars) plus MariaDB Connector/J (`.cache/jars/jdbc`, `make bench-load`
  resolves it); Spark's start, then `spark.read.jdbc` with `--spark-partitions` ranges
  of the key and a Delta write by path (then, untimed in the ratio, the JDBC read alone
  into Spark's `noop` sink: Spark's read against binlake's);
- binlake, as `load_replica_job` runs it: the plan (the key walked), Spark's start, the
  replica made of the first chunk, the load (`load.workers` processes into the changelog
  and the replica, typed as Arrow and appended by delta-rs; its peak RSS, parent and
  workers), the apply after it, then the replica's row count checked. With
  `--through-changelog`, the way a replica that takes no direct load goes: the load into
  the changelog alone, then the replica built from it by Spark.

Printed: the load average, each part's seconds, rows/s, peak RSS, and binlake ÷ Spark
(target <= 1.5). The source has no stream here (no connector, no broker): the chunks
count in the first lineage.

    make bench-load                                            # 2,000,000 rows
    .venv/bin/python bench/bench_load.py --rows 200000         # quick
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from binlog_assets.config import parse_config
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.environment import cache_dir
from binlog_assets.formats.event import FIRST_LINEAGE
from binlog_assets.lakehouse.spark import spark_conf

USER, PASSWORD = "binlake_load", "bench-pw"
TABLE = """CREATE TABLE bench.wide (
    id BIGINT PRIMARY KEY, customer_id INT NOT NULL, product_id INT NOT NULL,
    status VARCHAR(20) NOT NULL, amount DECIMAL(12,2) NOT NULL, created DATETIME(3),
    note VARCHAR(100) NULL, qty SMALLINT, price DOUBLE, shipped DATE, flag TINYINT,
    code CHAR(8))"""
FILL = """INSERT INTO bench.wide
    SELECT seq, seq % 50000, seq % 997, ELT(1 + seq % 4, 'new', 'paid', 'shipped', 'done'),
           (seq % 100000) / 100, TIMESTAMP'2026-01-01 00:00:00' + INTERVAL seq SECOND
             + INTERVAL (seq % 1000) * 1000 MICROSECOND,
           IF(seq % 5 = 0, NULL, CONCAT('order note ', seq)), seq % 300, seq / 7,
           DATE'2026-01-01' + INTERVAL (seq % 365) DAY, seq % 2, LPAD(seq % 99999999, 8, '0')
    FROM bench.seq_1_to_{rows}"""

SPARK_COPY = r"""
import json, sys, time
began = time.perf_counter()
from pyspark.sql import SparkSession
args = json.loads(sys.argv[1])
builder = SparkSession.builder
for k, v in args["conf"].items():
    builder = builder.config(k, v)
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("WARN")
started = time.perf_counter() - began
t = time.perf_counter()
frame = spark.read.jdbc(args["url"], "bench.wide", column="id", lowerBound=1,
                        upperBound=args["rows"], numPartitions=args["partitions"],
                        properties={"user": args["user"], "password": args["password"],
                                    "driver": "org.mariadb.jdbc.Driver", "fetchsize": "10000"})
frame.write.format("delta").mode("overwrite").save(args["path"])
copied = time.perf_counter() - t
rows = spark.read.format("delta").load(args["path"]).count()
t = time.perf_counter()
frame.write.format("noop").mode("overwrite").save()  # the read alone, every column
read = time.perf_counter() - t
print(json.dumps({"start": started, "copy": copied, "rows": rows, "read": read}))
"""


def load_average() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def build_source(server: MariaDBServer, rows: int) -> float:
    began = time.monotonic()
    with server.connect() as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE bench")
        cur.execute(TABLE)
        cur.execute(FILL.format(rows=int(rows)))
        cur.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (USER, PASSWORD))
        cur.execute("GRANT SELECT ON bench.* TO %s@'%%'", (USER,))
        cur.execute("GRANT BINLOG MONITOR ON *.* TO %s@'%%'", (USER,))
        cur.execute("SELECT COUNT(*), SUM(LENGTH(note)) FROM bench.wide")  # warm the pool
        cur.fetchall()
    return time.monotonic() - began


def jdbc_jars() -> list[str]:
    jars = sorted(str(p) for p in (cache_dir() / "jars" / "jdbc").glob("*.jar"))
    if not jars:
        raise SystemExit("no MariaDB Connector/J in .cache/jars/jdbc: run `make bench-load`")
    return jars


def spark_copy(pipeline, port: int, rows: int, partitions: int, path: str) -> dict:
    conf = spark_conf(pipeline)
    conf["spark.app.name"] = "jdbc-copy"
    conf["spark.jars"] = ",".join([conf["spark.jars"], *jdbc_jars()])
    # Spark applies its MySQL dialect (backquoted names) to jdbc:mysql: URLs only.
    url = f"jdbc:mysql://127.0.0.1:{port}/bench?permitMysqlScheme=true"
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", SPARK_COPY, json.dumps({
            "conf": conf, "url": url, "rows": rows, "partitions": partitions, "path": path,
            "user": USER, "password": PASSWORD})],
        check=True, capture_output=True, text=True)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    answer["wall"] = time.perf_counter() - began
    if answer["rows"] != rows:
        raise SystemExit(f"the Spark copy has {answer['rows']} rows, not {rows}")
    return answer


def binlake_load(pipeline, rows: int, direct: bool) -> dict:
    """As `load_replica_job` runs it: the plan, (`direct`: Spark's start, the replica
    made of the first chunk and held,) the chunks into the changelog (`direct`: and the
    replica), the replica's apply."""
    from deltalake import DeltaTable

    from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
    from binlog_assets.lakehouse.spark import get_spark
    from binlog_assets.load.direct import finish_direct, prepare_direct
    from binlog_assets.load.tables import load_first_chunk, load_table, new_plan
    from binlog_assets.parity.check import replica_sources
    from binlog_assets.parity.lake import replica_uri

    t = time.perf_counter()
    spark = get_spark(pipeline) if direct else None
    started = time.perf_counter() - t
    prepared = 0.0
    target = None
    for source, db, table in replica_sources(pipeline, "wide"):
        began = time.perf_counter()
        plan = new_plan(pipeline, db, table)
        planned = time.perf_counter() - began
        if direct:
            t = time.perf_counter()
            target = prepare_direct(spark, pipeline, "wide", plan.load_id, partial(
                load_first_chunk, pipeline, source, db, table, plan,
                lineage=lambda p: FIRST_LINEAGE))
            prepared = time.perf_counter() - t
        t = time.perf_counter()
        done = load_table(pipeline, source, db, table, plan, lineage=lambda p: FIRST_LINEAGE,
                          direct=target)
        loaded = time.perf_counter() - t
    rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if spark is None:
        t = time.perf_counter()
        spark = get_spark(pipeline)
        started = time.perf_counter() - t
    t = time.perf_counter()
    if target is not None:
        finish_direct(spark, pipeline, target)
    result = ReplicaBuilder(spark, pipeline).apply("wide")
    built = time.perf_counter() - t
    count = DeltaTable(replica_uri(pipeline, "wide")).count()
    # A direct load's first chunk came in before the load (`prepare`).
    if count != rows or (target is None and done.rows != rows):
        raise SystemExit(f"binlake's replica has {count} rows (loaded {done.rows}), not {rows}")
    return {"plan": planned, "prepare": prepared, "load": loaded, "chunks": done.chunks,
            "spark_start": started, "build": built, "rss_parent": rss_self,
            "rss_worker": rss_workers, "result": str(result)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk-rows", type=int, default=50_000)
    parser.add_argument("--spark-partitions", type=int, default=4)
    parser.add_argument("--through-changelog", action="store_true",
                        help="binlake's load into the changelog alone, the replica built "
                             "from it by Spark (the way a replica that takes no direct load "
                             "goes)")
    parser.add_argument("--order", choices=("spark-first", "binlake-first"),
                        default="spark-first")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bload-", dir="/tmp"))
    server = MariaDBServer(work / "db", buffer_pool="1G")
    try:
        server.start()
        made = build_source(server, args.rows)
        pipeline = parse_config({
            "kafka": {"group.id": "bench"},
            "lakehouse": {"path": str(work / "lake"), "database": "bench"},
            "spark": {"master": "local[2]"},
            "load": {"workers": args.workers, "chunk_rows": args.chunk_rows},
            "sources": [{"name": "bench", "topics": ["bench.bench.wide"],
                         "connection": {"host": "127.0.0.1", "port": server.port,
                                        "user": USER, "password": PASSWORD},
                         "tables": [{"source": "bench.wide", "replica": "wide"}]}]})
        print(f"source: bench.wide, {args.rows:,} rows of 12 columns, made in {made:.1f}s "
              f"({datetime.now(UTC):%Y-%m-%d %H:%M} UTC); load average {load_average()}")
        sides = ["spark", "binlake"] if args.order == "spark-first" else ["binlake", "spark"]
        figures = {}
        for side in sides:
            if side == "spark":
                figures[side] = spark_copy(pipeline, server.port, args.rows,
                                           args.spark_partitions, str(work / "copy"))
            else:
                figures[side] = binlake_load(pipeline, args.rows,
                                             direct=not args.through_changelog)
            print(f"{side} done, load average {load_average()}")
        s, b = figures["spark"], figures["binlake"]
        spark_total = s["wall"] - s["read"]  # the copy as its own process, without the extra read
        binlake_total = b["plan"] + b["prepare"] + b["load"] + b["spark_start"] + b["build"]
        print(f"spark copy: {spark_total:.1f}s as a process (Spark start {s['start']:.1f}s, "
              f"read.jdbc x{args.spark_partitions} + Delta write {s['copy']:.1f}s, "
              f"{args.rows / s['copy']:,.0f} rows/s; the JDBC read alone, after it, "
              f"{s['read']:.1f}s, {args.rows / s['read']:,.0f} rows/s)")
        way = "through the changelog" if args.through_changelog else "straight to the replica"
        print(f"binlake, {way}: {binlake_total:.1f}s (plan {b['plan']:.1f}s, "
              f"replica made of the first chunk {b['prepare']:.1f}s, load {b['load']:.1f}s "
              f"in {b['chunks']} chunks by {args.workers} workers, "
              f"{args.rows / b['load']:,.0f} rows/s; Spark start {b['spark_start']:.1f}s, "
              f"replica build {b['build']:.1f}s); peak RSS of the load: parent "
              f"{b['rss_parent']:.0f} MiB, largest worker {b['rss_worker']:.0f} MiB")
        ratio = binlake_total / spark_total
        print(f"ratio: binlake / spark copy {ratio:.2f} (target <= 1.5: "
              f"{'met' if ratio <= 1.5 else 'MISSED'}); load alone / spark copy "
              f"{b['load'] / spark_total:.2f}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
