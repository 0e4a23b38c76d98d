"""What the row-count check's changelog side costs on a 1M-row changelog, without Spark.

The changelog gets `--events` (1,000,000) change events of one source table over `--keys`
(200,000) keys, in commits of `--batch` (10,000) as consumer runs write them. Timed:
`audit_arrow.LiveKeys.count` from the snapshot (a follower's first check of a replica,
or a build's), then `--rounds` (20) more commits of `--small` (1,000) events, each
counted from the state of the count before (a follower's check after each apply), and
a count from the snapshot at the end. With `--spark`, the Spark reduction it replaces
(`audit.expected_live_rows`, what every check ran before) over the same changelog, on a
warm session, and the two counts must agree. With `--replica`, the check's other side as
a follower pays it: the replica built, then `--rounds` commits of `--small` events each
applied and checked (the count of `<replica>_current`, a Spark job, and `LiveKeys`).

    .venv/bin/python bench/bench_row_check.py            # ~2 min
    .venv/bin/python bench/bench_row_check.py --spark    # and the Spark reference
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time

from bench_maintenance import TABLE, TOPIC, Workload, write
from harness import load_average

from binlog_assets.config import parse_config
from binlog_assets.lakehouse.audit_arrow import LiveKeys, expected_rows
from binlog_assets.lakehouse.changelog_reader import changelog_version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--spark", action="store_true")
    parser.add_argument("--replica", action="store_true")
    args = parser.parse_args()

    lake = tempfile.mkdtemp(prefix="binlake-bench-row-check-")
    try:
        pipeline = parse_config({
            "lakehouse": {"path": lake, "database": "bench"},
            "spark": {"master": "local[2]", "conf": {"spark.driver.memory": "2g"}},
            "sources": [{"name": "shop", "topics": [TOPIC],
                         "tables": [{"source": TABLE, "replica": "orders"}]}]})
        work = Workload(args.keys, seed=7)
        began = time.perf_counter()
        for _ in range(args.events // args.batch):
            write(pipeline, work.batch(args.batch))
        print(f"changelog: {args.events:,} events in {args.events // args.batch} commits, "
              f"written in {time.perf_counter() - began:.1f} s")

        counter = LiveKeys(pipeline, "orders", append_only=False)
        began = time.perf_counter()
        live = counter.count(changelog_version(None, pipeline))
        full = time.perf_counter() - began
        print(f"from the snapshot: {live:,} live keys in {full:.2f} s")
        steps = []
        for _ in range(args.rounds):
            write(pipeline, work.batch(args.small))
            began = time.perf_counter()
            live = counter.count(changelog_version(None, pipeline))
            steps.append(time.perf_counter() - began)
        assert counter.full_reads == 1
        print(f"brought forward by {args.small:,} events: median "
              f"{statistics.median(steps):.3f} s, max {max(steps):.3f} s "
              f"over {args.rounds}")
        version = changelog_version(None, pipeline)
        began = time.perf_counter()
        again = expected_rows(pipeline, "orders", version, append_only=False)
        print(f"from the snapshot at the end: {again:,} in "
              f"{time.perf_counter() - began:.2f} s")
        assert again == live, (again, live)
        if args.spark:
            from binlog_assets.lakehouse.audit import expected_live_rows
            from binlog_assets.lakehouse.spark import get_spark

            spark = get_spark(pipeline)
            expected_live_rows(spark, pipeline, "orders", version)  # warm
            times = []
            for _ in range(3):
                began = time.perf_counter()
                reference = expected_live_rows(spark, pipeline, "orders", version)
                times.append(time.perf_counter() - began)
            assert reference == live, (reference, live)
            print(f"Spark's reduction (audit.expected_live_rows), warm: median "
                  f"{statistics.median(times):.2f} s over 3")
        if args.replica:
            _replica_side(pipeline, work, counter, args)
        print(load_average())
    finally:
        shutil.rmtree(lake, ignore_errors=True)


def _replica_side(pipeline, work, counter, args) -> None:
    """A follower's check after each apply: both counts, timed apart."""
    from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
    from binlog_assets.lakehouse.spark import get_spark
    from binlog_assets.orchestration.replica_reports import counted_rows

    builder = ReplicaBuilder(get_spark(pipeline), pipeline)
    began = time.perf_counter()
    rule = builder.apply("orders").key_rule
    print(f"replica built in {time.perf_counter() - began:.1f} s")
    spark_s, arrow_s, apply_s = [], [], []
    for _ in range(args.rounds):
        write(pipeline, work.batch(args.small))
        began = time.perf_counter()
        version = builder.apply("orders").applied_version
        apply_s.append(time.perf_counter() - began)
        began = time.perf_counter()
        live = counted_rows(builder, "orders", rule)
        spark_s.append(time.perf_counter() - began)
        began = time.perf_counter()
        expected = counter.count(version)
        arrow_s.append(time.perf_counter() - began)
        assert live == expected, (live, expected)
    print(f"per apply of {args.small:,} events over {args.rounds}: apply median "
          f"{statistics.median(apply_s):.2f} s; check: _current count median "
          f"{statistics.median(spark_s):.2f} s, changelog side median "
          f"{statistics.median(arrow_s):.3f} s")


if __name__ == "__main__":
    main()
