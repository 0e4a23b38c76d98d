"""Does a changelog follower run's memory stay flat while it follows a steady stream?

Starts its own broker (`harness.running_broker`), creates `--topics` (20) one-partition
topics and keeps producing Debezium records to them at `--rate` (200) records/s, while
`follow_changelog_job` runs in this process for `--seconds` (240) (a Dagster instance with
the project's `setup/dagster.yaml`, SQLite storage). Every 10 s it samples this process's
RSS, open files and threads. The limit it is held to is flat: the RSS after the first
minute (imports, the broker's metadata, librdkafka's buffers, the changelog's first
snapshot) against the RSS at the end, printed as MB per minute over the rest of the run.
`--trace` also compares tracemalloc snapshots (after the first minute, at the end): the
Python lines whose memory grew most; RSS growing without them is native memory
(librdkafka, delta-rs). The changelog rows are printed beside the records sent (those
sent after its last round are not in it).

    .venv/bin/python bench/bench_follower_memory.py [--topics 20] [--rate 200]
        [--seconds 240] [--trace]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import dagster as dg
from harness import (
    debezium_records,
    follower_location,
    load_average,
    produce_records,
    running_broker,
)

from binlog_assets.dev.kafka import create_topics
from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME, partition_key

SAMPLE_SECONDS = 10.0
SETTLE_SECONDS = 60.0


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Producing(threading.Thread):
    """Records to every topic at `rate` per second in all, in 0.1 s batches."""

    def __init__(self, bootstrap: str, topics: list[str], rate: float) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topics, self.rate = bootstrap, topics, rate
        self.stopped = threading.Event()
        self.sent = 0
        self.streams = [debezium_records(10**9, 1000, small=True, seed=i, first_id=i * 1000)
                        for i in range(len(topics))]

    def run(self) -> None:
        per_batch = max(1, round(self.rate / 10))
        n = 0
        while not self.stopped.is_set():
            began = time.monotonic()
            batch = []
            for _ in range(per_batch):
                i = n % len(self.topics)
                key, value = next(self.streams[i])
                batch.append((self.topics[i], key, value))
                n += 1
            produce_records(self.bootstrap, batch)
            self.sent += len(batch)
            time.sleep(max(0.0, 0.1 - (time.monotonic() - began)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=20)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="binlake-follower-memory-"))
    try:
        with running_broker() as broker:
            bootstrap = broker.bootstrap_servers
            topics = [f"memory-{i:03d}" for i in range(args.topics)]
            create_topics(bootstrap, topics)
            location = follower_location(work, bootstrap, topics, "memory", args.seconds, 0.5)
            pipeline, resource, home = location.pipeline, location.resource, location.home
            from binlog_assets.orchestration.changelog_follower import follow_changelog_job

            producing = Producing(bootstrap, topics, args.rate)
            samples: list[tuple[float, float, int, int, float]] = []
            snapshots: list[tracemalloc.Snapshot] = []
            done = threading.Event()
            began = time.monotonic()

            def sample() -> None:
                while not done.wait(SAMPLE_SECONDS):
                    at = time.monotonic() - began
                    samples.append((at, rss_mb(), len(os.listdir("/proc/self/fd")),
                                    threading.active_count(),
                                    tracemalloc.get_traced_memory()[0] / 2**20))
                    print(f"  {at:5.0f}s rss {samples[-1][1]:6.0f} MB "
                          f"(Python {samples[-1][4]:.0f} MB traced), "
                          f"{samples[-1][2]} files, {samples[-1][3]} threads, "
                          f"{producing.sent} records sent", flush=True)
                    if args.trace and not snapshots and at >= SETTLE_SECONDS:
                        snapshots.append(tracemalloc.take_snapshot())

            if args.trace:
                tracemalloc.start(8)
            with dg.DagsterInstance.from_config(str(home)) as instance:
                instance.add_dynamic_partitions(
                    KAFKA_PARTITIONS_NAME, [partition_key(t, 0) for t in topics])
                producing.start()
                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
                result = follow_changelog_job.execute_in_process(
                    instance=instance, resources={"binlake": resource},
                    run_config={"ops": {"follow_changelog": {
                        "config": {"seconds": args.seconds}}}})
                producing.stopped.set()
                producing.join()
                if args.trace:
                    snapshots.append(tracemalloc.take_snapshot())
                done.set()
                sampler.join()
                rounds = sum(1 for e in instance.all_logs(result.run_id)
                             if e.dagster_event is not None
                             and e.dagster_event.event_type_value == "ASSET_MATERIALIZATION")
            if not result.success:
                raise RuntimeError("the follower run failed")
            settled = [s for s in samples if s[0] >= SETTLE_SECONDS]
            first, last = settled[0], settled[-1]
            minutes = (last[0] - first[0]) / 60
            print(f"\n{args.topics} topics, {args.rate:.0f} records/s, {args.seconds:.0f} s, "
                  f"{rounds} partition materializations; {load_average()}")
            print(f"rss {first[1]:.0f} MB at {first[0]:.0f} s -> {last[1]:.0f} MB at "
                  f"{last[0]:.0f} s: {(last[1] - first[1]) / minutes:+.1f} MB/min "
                  f"(flat: 0); files {first[2]} -> {last[2]}, threads {first[3]} -> "
                  f"{last[3]}")
            if args.trace:
                print(f"Python (traced) {first[4]:.0f} -> {last[4]:.0f} MB: "
                      f"{(last[4] - first[4]) / minutes:+.1f} MB/min")
            if args.trace and len(snapshots) == 2:
                print("\nPython memory grown most (tracemalloc, after the first minute "
                      "to the end):")
                for stat in snapshots[1].compare_to(snapshots[0], "traceback")[:8]:
                    print(f"  {stat.size_diff / 2**20:+7.1f} MB {stat.count_diff:+7d} blocks")
                    for line in stat.traceback.format()[-8:]:
                        print(f"      {line}")
            from binlog_assets.lakehouse.changelog import changelog_uri
            from binlog_assets.orchestration.table_metadata import delta_row_count

            rows = delta_row_count(changelog_uri(pipeline))
            print(f"changelog rows {rows}, records sent {producing.sent}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
