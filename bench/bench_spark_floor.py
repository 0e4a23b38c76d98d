"""E3's floor on the replica side: what Spark alone costs to create `--tables` Delta tables.

The E3 target (catch-up <= 2x a raw consume plus a plain Delta write of the final rows)
leaves binlake about one baseline of time for everything the baseline does not do,
while the issue keeps Spark where replicas are built. This measures the least that
Spark can take for that: a minimal CTAS per table (`CREATE TABLE ... USING delta AS
SELECT` eight columns of `--rows` generated rows: no changelog read, no reduce, no JSON),
each in a session of its own, `--parallel` at a time, on a driver started with the
product's settings (`get_spark`: `local[2]`, the class archive, C1) and warmed up by
`--warmup` tables first. Side by side, the same tables written by delta-rs
(`write_deltalake`, the E3 baseline's write), one after another.

Printed: the driver's start, its first CTAS, the timed CTAS (wall, median), the delta-rs
writes, and Spark / delta-rs.

    .venv/bin/python bench/bench_spark_floor.py                # 50 tables of 1,600 rows
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake
from harness import load_average

from binlog_assets.config import parse_config
from binlog_assets.lakehouse.spark import get_spark

DATABASE = "floor"
SELECT = ("SELECT id, id * 2 AS a, CAST(id AS STRING) AS b, id % 7 AS c, "
          "CAST(id AS DOUBLE) AS d, TIMESTAMP'2026-01-01 00:00:00' AS e, 'x' AS f, "
          "id + 1 AS g FROM range({rows})")


def arrow_rows(rows: int) -> pa.Table:
    """The CTAS's rows as Arrow, for delta-rs."""
    ids = pa.array(range(rows), pa.int64())
    return pa.table({
        "id": ids, "a": pc.multiply(ids, 2), "b": pc.cast(ids, pa.string()),
        "c": pc.remainder(ids, 7), "d": pc.cast(ids, pa.float64()),
        "e": pa.array([datetime(2026, 1, 1, tzinfo=UTC)] * rows, pa.timestamp("us", "UTC")),
        "f": pa.array(["x"] * rows), "g": pc.add(ids, 1),
    })


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", type=int, default=50)
    parser.add_argument("--rows", type=int, default=1_600, help="rows per table")
    parser.add_argument("--parallel", type=int, default=2, help="CTAS at a time")
    parser.add_argument("--warmup", type=int, default=10, help="tables made before timing")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="binlake-floor-")
    try:
        pipeline = parse_config({
            "kafka": {"bootstrap.servers": "127.0.0.1:9"},
            "lakehouse": {"path": os.path.join(root, "lake"), "database": DATABASE},
            "sources": [{"name": "s", "format": "debezium", "topics": ["t"]}],
        })
        began = time.perf_counter()
        spark = get_spark(pipeline)
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
        started = time.perf_counter() - began
        select = SELECT.format(rows=args.rows)

        def ctas(name: str) -> float:
            session = spark.newSession()  # as each replica builder has one
            a = time.perf_counter()
            session.sql(f"CREATE TABLE {DATABASE}.{name} USING delta AS {select}")
            return time.perf_counter() - a

        first = ctas("first")
        for i in range(args.warmup):
            ctas(f"warm{i}")
        a = time.perf_counter()
        with ThreadPoolExecutor(args.parallel) as pool:
            each = list(pool.map(ctas, [f"t{i}" for i in range(args.tables)]))
        spark_wall = time.perf_counter() - a

        rows = arrow_rows(args.rows)
        a = time.perf_counter()
        for i in range(args.tables):
            write_deltalake(os.path.join(root, "plain", f"t{i}"), rows)
        plain = time.perf_counter() - a

        print(f"driver start {started:.2f}s, its first CTAS {first:.2f}s "
              f"({args.warmup} more before timing); {load_average()}")
        print(f"Spark: {args.tables} CTAS of {args.rows:,} rows, {args.parallel} at a time: "
              f"{spark_wall:.2f}s (median {statistics.median(each):.3f}s each)")
        print(f"delta-rs: the same {args.tables} tables one after another: {plain:.2f}s")
        print(f"Spark / delta-rs = {spark_wall / plain:.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
