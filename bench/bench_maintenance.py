"""Maintenance payoff: one small `ReplicaBuilder.apply` after 1,000 small changelog
commits, before and after `lakehouse_maintenance_job`'s compaction, against a freshly
written table holding the same rows.

The changelog gets `--commits` (1,000) consume-sized commits of `--batch` (50) change
events each (c/u/d over `--keys` keys, positions rising), written as a consumer run
writes them: `ChangelogWriter.write`, delta-rs, one commit per call with its transaction
and survey. The replica follows every `--apply-every` (25) commits, as a follower run
does (it applies each version as it lands; applying each of the 1,000 would take most
of an hour here), so both tables collect the small files a day of runs leaves. The
baseline, in the same run and Spark session, is a fresh lake: the same events in one
changelog commit and one initial build of the replica. Then `--rounds` (5) batches, each
applied to the lake of small commits and to the fresh one in turn; then maintenance, what
the job runs (`compact_changelog` with its VACUUM, `compact_table` of the replica:
OPTIMIZE, VACUUM; retention is off, so every row stays); then `--rounds` batches again.
Each apply is timed, and so is what the replica's `row_count_matches_changelog` check
runs after it: a count of the live keys over the whole changelog
(`audit.expected_live_rows`), the read that sees every small file, where the apply reads
only the new commit's.

Printed: the files of both tables before and after maintenance, each timed step, the
medians, and before / fresh and after / fresh for both steps (compaction should bring
the second to about 1; the first is what a day without maintenance costs).

    .venv/bin/python bench/bench_maintenance.py                   # 1,000 commits (~8 min)
    .venv/bin/python bench/bench_maintenance.py --commits 200     # quick (~3 min)
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal

from harness import load_average

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.formats.event import PHASE_STREAM, ChangeEvent, Position
from binlog_assets.lakehouse.audit import expected_live_rows
from binlog_assets.lakehouse.changelog import (
    ChangelogWriter,
    PartitionWrite,
    changelog_uri,
)
from binlog_assets.lakehouse.delta_log import table_location
from binlog_assets.lakehouse.maintenance import compact_changelog, compact_table, live_files
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.lakehouse.spark import get_spark

TABLE = "shop.orders"
TOPIC = "bench.orders"
GROUP = "bench"
TYPES = {"id": "bigint", "customer_id": "bigint", "status": "string",
         "amount": "decimal(10,2)", "qty": "int"}
STATUSES = ("new", "paid", "shipped", "delivered", "returned")


class Workload:
    """Change events of one source table over `keys` keys: a key that is not there is
    created, one that is gets updated (or, one time in six, deleted)."""

    def __init__(self, keys: int, seed: int) -> None:
        self.keys = keys
        self.rng = random.Random(seed)
        self.alive: set[int] = set()
        self.pos = 4
        self.offset = 0

    def _row(self, key: int) -> dict:
        r = self.rng.randrange(1_000_000)
        return {"id": key, "customer_id": r % 50_000, "status": STATUSES[r % 5],
                "amount": Decimal(f"{r % 100_000}.{r % 100:02d}"), "qty": r % 20 + 1}

    def batch(self, size: int) -> list[ChangeEvent]:
        events = []
        for _ in range(size):
            key = self.rng.randrange(self.keys)
            self.pos += 200
            if key not in self.alive:
                op, before, after = "c", None, self._row(key)
                self.alive.add(key)
            elif self.rng.random() < 1 / 6:
                op, before, after = "d", self._row(key), None
                self.alive.discard(key)
            else:
                op, before, after = "u", self._row(key), self._row(key)
            events.append(ChangeEvent(
                TABLE, op, (key,), ("id",), before, after,
                Position(PHASE_STREAM, 7, self.pos, 0), 1_700_000_000_000 + self.pos,
                topic=TOPIC, offset=self.offset, column_types=TYPES))
            self.offset += 1
        return events


def write(pipeline: PipelineConfig, events: list[ChangeEvent]) -> None:
    """One changelog commit of `events`, as a consumer run makes it."""
    ChangelogWriter(pipeline).write(PartitionWrite(
        events, None, group_id=GROUP, topic=TOPIC, partition=0,
        end_offset=events[-1].offset + 1))


def timed(step: Callable[[], object]) -> float:
    began = time.perf_counter()
    step()
    return time.perf_counter() - began


def files(spark, pipeline: PipelineConfig) -> str:  # a SparkSession
    """The changelog's and the replica's live files (and MiB)."""
    out = []
    for name, location in (("changelog", changelog_uri(pipeline)),
                           ("replica", table_location(spark, pipeline.lakehouse.database,
                                                      "orders"))):
        n, size = live_files(location)
        out.append(f"{name} {n:,} files ({size / 2**20:.1f} MiB)")
    return ", ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=1000,
                        help="small changelog commits before maintenance")
    parser.add_argument("--batch", type=int, default=50, help="change events per commit")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--apply-every", type=int, default=25,
                        help="the replica applies after this many commits")
    parser.add_argument("--rounds", type=int, default=5, help="timed applies per side")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    lake = tempfile.mkdtemp(prefix="binlake-bench-maintenance-")
    try:
        def pipeline_for(database: str) -> PipelineConfig:
            return parse_config({
                "lakehouse": {"path": lake, "database": database},
                "spark": {"master": "local[2]", "conf": {"spark.driver.memory": "2g"}},
                "sources": [{"name": "shop", "topics": [TOPIC],
                             "tables": [{"source": TABLE, "replica": "orders"}]}],
            })

        daily, fresh = pipeline_for("daily"), pipeline_for("fresh")
        spark = get_spark(daily)
        builder = ReplicaBuilder(spark, daily)
        work = Workload(args.keys, args.seed)
        written: list[ChangeEvent] = []
        began = time.perf_counter()
        for i in range(1, args.commits + 1):
            events = work.batch(args.batch)
            write(daily, events)
            written += events
            if i % args.apply_every == 0 or i == args.commits:
                builder.apply("orders")
        print(f"{args.commits:,} commits of {args.batch} events, an apply every "
              f"{args.apply_every}: {time.perf_counter() - began:.0f}s; "
              f"{files(spark, daily)}", flush=True)

        def apply_batch(pipeline: PipelineConfig, on: ReplicaBuilder, events: list
                        ) -> tuple[float, float]:
            """Seconds of the apply of `events`, and of the row-count check's count of
            the replica's live keys in the whole changelog (`audit.expected_live_rows`)."""
            write(pipeline, events)
            applied = timed(lambda: on.apply("orders"))
            version = on.applied_version("orders")
            return applied, timed(lambda: expected_live_rows(on.spark, pipeline, "orders",
                                                             version))

        fresh_builder = ReplicaBuilder(spark, fresh)
        build = timed(lambda: (write(fresh, written), fresh_builder.apply("orders")))
        print(f"fresh lake: {len(written):,} events in one commit, one initial build "
              f"({build:.1f}s); {files(spark, fresh)}", flush=True)

        def rounds() -> tuple[list, list]:
            """`--rounds` batches, each applied to both lakes in turn."""
            daily_times, fresh_times = [], []
            for _ in range(args.rounds):
                events = work.batch(args.batch)
                daily_times.append(apply_batch(daily, builder, events))
                fresh_times.append(apply_batch(fresh, fresh_builder, events))
            return daily_times, fresh_times

        before, fresh_before = rounds()
        files_before = files(spark, daily)
        changelog_seconds = timed(lambda: compact_changelog(daily, vacuum=True))
        replica_seconds = timed(lambda: compact_table(builder.spark, daily,
                                                      builder.table_name("orders")))
        print(f"maintenance: changelog (delta-rs) {changelog_seconds:.1f}s, replica "
              f"(OPTIMIZE, VACUUM) {replica_seconds:.1f}s; before: {files_before}; after: "
              f"{files(spark, daily)}", flush=True)
        after, fresh_after = rounds()
        live = [spark.table(f"{c.lakehouse.database}.orders_current").count()
                for c in (daily, fresh)]
        if live[0] != live[1]:
            raise RuntimeError(f"the maintained replica has {live[0]} live rows, the fresh "
                               f"one {live[1]}")
    finally:
        shutil.rmtree(lake, ignore_errors=True)

    print(f"\n{live[0]:,} live rows in both replicas")
    for step, what in ((0, f"apply of {args.batch} events"),
                       (1, "row-count check's changelog count")):
        medians = []
        for name, measured in (("before maintenance", before),
                               ("fresh, same rounds", fresh_before),
                               ("after maintenance", after), ("fresh, same rounds", fresh_after)):
            times = [m[step] for m in measured]
            medians.append(statistics.median(times))
            print(f"{what}, {name}: " + ", ".join(f"{t:.2f}s" for t in times)
                  + f" (median {medians[-1]:.2f}s)")
        print(f"{what}: before / fresh = {medians[0] / medians[1]:.2f}, after / fresh = "
              f"{medians[2] / medians[3]:.2f}, after / before = {medians[2] / medians[0]:.2f}")
    print(f"at the end: {load_average()}")


if __name__ == "__main__":
    main()
