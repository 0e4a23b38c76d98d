"""Where one changelog follower round's seconds go, over many one-partition topics.

Starts its own broker (`harness.running_broker`), creates `--topics` (100) topics and
produces `--records` (5) Debezium records to each, then runs `follow_changelog_job` in
process (a Dagster instance with the project's `setup/dagster.yaml`, SQLite storage)
for exactly one round, twice: the first round also creates the changelog table, the
second (after as many new records again) is the steady state. The real code runs; its
parts are timed by wrapping them: the lag measurements, the round over every due
partition (`consume_round`) and its report (`report_round`), and inside them the
per-partition costs (summed over the round's threads: with 4 at a time they overlap,
so a part's wall share is about a quarter of its sum). A part this checkout does not
have is left out.

    .venv/bin/python bench/bench_follow_round.py [--topics 100] [--records 5]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import dagster as dg
from confluent_kafka import Consumer
from harness import (
    debezium_records,
    follower_location,
    load_average,
    produce_records,
    running_broker,
)

from binlog_assets.config import PipelineConfig
from binlog_assets.dev.kafka import create_topics
from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME, partition_key
from binlog_assets.orchestration.resources import BinlakeResource


class Timings:
    """Seconds and calls per label, summed over threads."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def add(self, label: str, seconds: float) -> None:
        with self._lock:
            self.seconds[label] += seconds
            self.calls[label] += 1

    def wrap(self, owner: object, name: str, label: str, *, cpu: bool = False) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return

        def timed(*args: object, **kwargs: object) -> object:
            began, used = time.perf_counter(), time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.add(label, time.perf_counter() - began)
                if cpu:
                    self.add(f"{label} (process CPU)", time.process_time() - used)

        setattr(owner, name, timed)


class TimedLock:
    """The changelog writer's lock, with the seconds it was waited for and held: its
    commits take turns, so the held time is a floor under the round's consume part."""

    def __init__(self, t: Timings) -> None:
        self.t, self.lock, self.since = t, threading.Lock(), 0.0

    def __enter__(self) -> None:
        began = time.perf_counter()
        self.lock.acquire()
        self.since = time.perf_counter()
        self.t.add("writer lock: waited", self.since - began)

    def __exit__(self, *exc: object) -> None:
        self.t.add("writer lock: held", time.perf_counter() - self.since)
        self.lock.release()


def instrument(t: Timings, rounds: list[int]) -> None:
    """Wrap the round's parts; the follower stops once `rounds[0]` rounds reported."""
    import deltalake

    from binlog_assets.consume import backlog, commit, lag, run
    from binlog_assets.lakehouse.changelog import ChangelogWriter
    from binlog_assets.orchestration import changelog_asset, changelog_follower

    try:
        from binlog_assets.orchestration import changelog_reports
        from binlog_assets.rounds import queue as consume_runs
        from binlog_assets.rounds import report as round_report
        from binlog_assets.rounds import round_commit
        round_name, report_name = "consume_round", "report_round"
    except ImportError:  # a checkout before the round's report had its module
        changelog_reports = round_report = changelog_asset
        round_name, report_name = "run_partitions", "report_outcomes"
        try:
            from binlog_assets.rounds import plan as consume_runs
            from binlog_assets.rounds import round_commit
        except ImportError:  # a checkout before the consume round had its room
            from binlog_assets.orchestration import consume_runs
            try:
                from binlog_assets.orchestration import round_commit
            except ImportError:  # before rounds committed together
                round_commit = None

    t.wrap(lag, "measure_lag", "lag: follower (due, after)")
    t.wrap(backlog, "measure_lag", "lag: worker decision")
    t.wrap(round_report, "measure_lag", "lag: report")
    # The labels stay those of the first checkouts measured, so that runs compare.
    t.wrap(changelog_follower, round_name, "ROUND run_partitions", cpu=True)
    t.wrap(changelog_follower, "held_partitions", "due: held partitions")
    t.wrap(consume_runs, "run_partition", "partition: run_partition")
    t.wrap(changelog_follower, "latest_metadata_checkpoint", "partition: metadata checkpoint")
    t.wrap(changelog_follower, "latest_metadata_checkpoints", "ROUND metadata checkpoints")
    t.wrap(ChangelogWriter, "checkpoint", "partition: changelog checkpoint")
    t.wrap(run.BoundedRun, "_consumer", "partition: consumer created")
    t.wrap(run.BoundedRun, "_resolve", "partition: checkpoint resolved")
    t.wrap(ChangelogWriter, "write", "partition: changelog write (lock incl.)")
    t.wrap(ChangelogWriter, "write_many", "changelog commit of many partitions (lock incl.)")
    t.wrap(ChangelogWriter, "checkpoints", "changelog checkpoints (lock incl.)")
    if round_commit is not None:
        t.wrap(round_commit.RoundCommit, "read_checkpoints", "ROUND checkpoints read together")
        t.wrap(round_commit.RoundCommit, "commit", "ROUND last commit points together")
        t.wrap(round_commit.RoundCommit, "_commit_kafka", "round: kafka commit together")
    t.wrap(deltalake, "write_deltalake", "partition: delta-rs commit")
    t.wrap(deltalake.DeltaTable, "update_incremental", "partition: delta-rs log update")
    t.wrap(deltalake.DeltaTable, "transaction_version", "partition: delta-rs txn version")
    t.wrap(commit.Committer, "commit", "partition: kafka commit")
    if hasattr(changelog_follower, "KeptGauge"):
        t.wrap(changelog_follower.KeptGauge, "rows", "report: changelog row count")
    else:
        t.wrap(changelog_asset, "_table_metadata", "report: changelog row count")
    t.wrap(changelog_reports, "source_observation", "report: source observation")
    t.wrap(dg.OpExecutionContext, "log_event", "report: log_event")

    made = ChangelogWriter.__init__

    def writer_init(self: ChangelogWriter, *args: object) -> None:
        made(self, *args)
        self._lock = TimedLock(t)

    ChangelogWriter.__init__ = writer_init

    class TimedClose(Consumer):
        def close(self) -> None:
            began = time.perf_counter()
            super().close()
            t.add("partition: consumer closed", time.perf_counter() - began)

    run.Consumer = TimedClose

    # Counted here, not wrapped above: the follower calls it through its module.
    reported = getattr(changelog_follower, report_name)

    def report(*args: object, **kwargs: object) -> bool:
        began, used = time.perf_counter(), time.process_time()
        try:
            return reported(*args, **kwargs)
        finally:
            t.add("ROUND report_outcomes", time.perf_counter() - began)
            t.add("ROUND report_outcomes (process CPU)", time.process_time() - used)
            rounds[0] -= 1

    setattr(changelog_follower, report_name, report)
    changelog_follower.changelog_backfill_in_progress = (
        lambda instance: "bench-stop" if rounds[0] <= 0 else None)


def produce(bootstrap: str, topics: list[str], count: int, first: int) -> None:
    produce_records(bootstrap, ((topic, key, value) for i, topic in enumerate(topics)
                                for key, value in debezium_records(
                                    count, count, seed=i, first_id=first)))


def one_round(job: Callable, instance: dg.DagsterInstance, resource: BinlakeResource,
              rounds: list[int]) -> float:
    rounds[0] = 1
    began = time.monotonic()
    result = job.execute_in_process(instance=instance, resources={"binlake": resource},
                                    run_config={"ops": {"follow_changelog": {
                                        "config": {"seconds": 600}}}})
    if not result.success:
        raise RuntimeError("the follower run failed")
    return time.monotonic() - began


def check(pipeline: PipelineConfig, topics: list[str], records: int) -> None:
    """Every partition's records in the changelog once, and its checkpoints at the end."""
    from binlog_assets.consume.lag import measure_lag
    from binlog_assets.lakehouse.changelog import (
        ChangelogWriter,
        changelog_uri,
    )
    from binlog_assets.orchestration.table_metadata import delta_row_count

    group = pipeline.kafka["group.id"]
    writer = ChangelogWriter(pipeline)
    wrong = [t for t in topics if writer.checkpoint(group, t, 0) != records]
    wrong += [pl.topic for pl in measure_lag(dict(pipeline.kafka), group, topics)
              if pl.committed != records]
    rows = delta_row_count(changelog_uri(pipeline))
    if wrong or rows != records * len(topics):
        raise RuntimeError(f"the changelog holds {rows} rows; checkpoints not at {records}: "
                           f"{sorted(set(wrong))}")
    print(f"\nchecked: {rows} changelog rows, every checkpoint at {records}")


def show(name: str, t: Timings, wall: float, partitions: int) -> None:
    print(f"\n{name}: follower run {wall:.2f}s; {load_average()}")
    for label in sorted(t.seconds, key=lambda k: (not k.startswith(("ROUND", "lag")), k)):
        s, n = t.seconds[label], t.calls[label]
        print(f"  {label:42s} {s:7.2f}s  {n:4d} calls  {1000 * s / partitions:7.1f} ms/partition")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--records", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="binlake-follow-round-"))
    try:
        with running_broker() as broker:
            bootstrap = broker.bootstrap_servers
            topics = [f"follow-{i:03d}" for i in range(args.topics)]
            create_topics(bootstrap, topics)
            produce(bootstrap, topics, args.records, 0)
            location = follower_location(work, bootstrap, topics, "follow", 600, 0.2)
            pipeline, resource, home = location.pipeline, location.resource, location.home
            from binlog_assets.orchestration.changelog_follower import follow_changelog_job

            rounds = [0]
            timings = Timings()
            instrument(timings, rounds)
            with dg.DagsterInstance.from_config(str(home)) as instance:
                instance.add_dynamic_partitions(
                    KAFKA_PARTITIONS_NAME, [partition_key(t, 0) for t in topics])
                for name, first in (("round 1 (the changelog's first write)", 0),
                                    ("round 2 (steady)", args.records)):
                    if first:
                        produce(bootstrap, topics, args.records, first)
                    timings.reset()
                    show(name, timings, one_round(follow_changelog_job, instance, resource,
                                                  rounds), args.topics)
            check(pipeline, topics, 2 * args.records)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
