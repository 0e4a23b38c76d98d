"""A driver's fixed cost with and without the class archive, side by side.

Each round starts two fresh processes, one per side, in alternating order: each writes
a changelog of `--events` Debezium-shaped changes over `--tables` tables (delta-rs, no
JVM), then starts Spark as a replica build does (`get_spark`, the catalog's first use),
and applies every replica once (new replicas: their first commit). Side "archive" maps
the class archive `make setup` built (`spark.class_archive: true`, the default); side
"none" sets it off. Printed: per side the medians of the Spark start, the first apply,
the other applies and the whole process (interpreter, JVM exit included), and archive /
none for each (lower is better).

    .venv/bin/python bench/bench_spark_start.py            # 4 rounds
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from decimal import Decimal

from harness import load_average

SIDES = ("archive", "none")


def child(side: str, lake: str, events: int, tables: int) -> dict:
    from binlog_assets.config import parse_config
    from binlog_assets.formats.event import ChangeEvent, Position
    from binlog_assets.lakehouse.changelog import ChangelogWriter, PartitionWrite
    from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
    from binlog_assets.lakehouse.spark import get_spark

    pipeline = parse_config({
        "kafka": {"bootstrap.servers": "127.0.0.1:9"},
        "lakehouse": {"path": lake, "database": "start"},
        "spark": {"class_archive": side == "archive"},
        "sources": [{"name": "shop", "format": "debezium", "topics": ["binlog"],
                     "tables": [{"source": f"shop.t{t}", "replica": f"t{t}"}
                                for t in range(tables)]}],
    })
    types = {"id": "bigint", "amount": "decimal(10,2)", "note": "string"}
    batch = [ChangeEvent(f"shop.t{i % tables}", "c", (i,), ("id",), None,
                         {"id": i, "amount": Decimal("1.25"), "note": f"n{i}"},
                         Position(1, 1, 100 + i, 0), 1_700_000_000_000 + i,
                         column_types=types, topic="binlog", partition=0, offset=i)
             for i in range(events)]
    ChangelogWriter(pipeline).write(PartitionWrite(batch, None, group_id="start",
                                                   topic="binlog", partition=0,
                                                   end_offset=events))
    began = time.perf_counter()
    spark = get_spark(pipeline)
    spark.catalog.tableExists("start.changelog")
    started = time.perf_counter() - began
    builder = ReplicaBuilder(spark, pipeline)
    applies = []
    for t in range(tables):
        a = time.perf_counter()
        result = builder.apply(f"t{t}")
        applies.append(time.perf_counter() - a)
        expected = len(range(t, events, tables))
        if result.written != expected:
            raise RuntimeError(f"t{t}: wrote {result.written}, expected {expected}")
    return {"start": started, "first": applies[0], "rest": statistics.median(applies[1:])}


def run_side(side: str, events: int, tables: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"binlake-bench-start-{side}-") as lake:
        began = time.perf_counter()
        done = subprocess.run(
            [sys.executable, __file__, "--child", side, "--lake", lake,
             "--events", str(events), "--tables", str(tables)],
            capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"{side} child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["process"] = wall
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--tables", type=int, default=3)
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--lake", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.lake, args.events, args.tables)))
        return

    from binlog_assets.lakehouse.spark import archive_file

    archive = archive_file()
    if not archive.is_file():
        sys.exit(f"no class archive at {archive}: run `make setup` first")
    print(f"archive {archive} ({archive.stat().st_size / 2**20:.0f} MiB); "
          f"{load_average()}", flush=True)
    results: dict[str, list[dict]] = {s: [] for s in SIDES}
    for i in range(args.rounds):
        for side in (SIDES if i % 2 == 0 else SIDES[::-1]):
            figures = run_side(side, args.events, args.tables)
            results[side].append(figures)
            print(f"round {i + 1} {side:<8} " + " ".join(
                f"{k} {v:.2f}s" for k, v in figures.items()), flush=True)
    print(f"\n{args.events:,} changes over {args.tables} new replicas, {args.rounds} rounds "
          f"a side; medians in seconds")
    print(f"{'':<24}{'archive':>9}{'none':>9}{'ratio':>8}")
    for key, label in (("start", "Spark start"), ("first", "first apply"),
                       ("rest", "later applies"), ("process", "whole process")):
        on = statistics.median(r[key] for r in results["archive"])
        off = statistics.median(r[key] for r in results["none"])
        print(f"{label:<24}{on:>9.2f}{off:>9.2f}{on / off:>8.2f}")
    print(load_average())


if __name__ == "__main__":
    main()
