"""Where one replica follower round's seconds go, over many busy replicas.

No Kafka: the changelog is written directly (`ChangelogWriter`, the test helpers of
tests/lakehouse/lake_events.py). `--replicas` (100) replicas, one source table each, are
built by a first `follow_replicas_job` run (in process, a Dagster instance with the
project's `setup/dagster.yaml`, SQLite storage). `--changelog-events` (200) changelog
materializations are then recorded, as consumer runs would. A second run follows: its
first round finds every replica current (the idle round), after which one changelog
commit touching every table (`--rows` rows each) is written, and its second round, the
one measured, applies and reports all of them. The run stops after it (its pool
hand-over check says so). A run's end checks every pending replica, a Spark count each:
here the build run checks none and the measured one a sample (`--end-checks`, timed
apart), which keeps a bench run to about two minutes on a quiet machine.

The real code runs; its parts are timed by wrapping them, per replica and in total:
the apply (`ReplicaBuilder.apply`, summed over the follower's threads, which overlap)
and its steps, the row-count check, each Dagster event write by kind, and the op's
side of the round (reporting between applies, waiting for them). The round is also
profiled (the op's thread, and every apply in its thread, merged): the top cumulative
costs follow the table.

    .venv/bin/python bench/bench_replica_round.py [--replicas 100] [--rows 3] [--top 40]
        [--changelog-events 200] [--end-checks 10] [--snapshot]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
from bench_follow_round import Timings

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.environment import REPO_ROOT
from binlog_assets.orchestration.resources import BinlakeResource

sys.path.insert(0, str(REPO_ROOT / "tests" / "lakehouse"))
from lake_events import Partition, Source, row

from binlog_assets.lakehouse.changelog import ChangelogWriter


class Round:
    """The measured round's bounds, its profiles and the run's stop decisions."""

    def __init__(self, t: Timings, write: Callable[[], None]) -> None:
        self.t, self.write = t, write
        self.stops = 0  # pool_wanted calls this run: one per poll
        self.began = self.ended = 0.0
        self.main: cProfile.Profile | None = None
        self.threads: list[cProfile.Profile] = []
        self.lock = threading.Lock()
        self.profiling = False
        self.end_checks = 0

    def start_run(self) -> None:
        self.stops = 0

    def stop(self, measure: bool) -> bool:
        """Whether the run stops at this poll; a measured run writes the commit after its
        idle round and stops after the next."""
        self.stops += 1
        if not measure:
            return True
        if self.stops == 1:
            self.write()
            self.t.reset()
            self.main = cProfile.Profile()
            self.profiling = True
            self.began = time.perf_counter()
            self.main.enable()
            return False
        if self.stops == 2:
            self.main.disable()
            self.profiling = False
            self.ended = time.perf_counter()
            self.round = (dict(self.t.seconds), dict(self.t.calls))
            self.t.reset()
        return True


def instrument(t: Timings, r: Round, measuring: list[bool]) -> None:
    from binlog_assets.lakehouse import audit_arrow, changelog_reader, delta_log
    from binlog_assets.lakehouse.replica import arrow_apply, arrow_commit, builder, plan
    from binlog_assets.orchestration import replica_follower, replica_versions, table_metadata

    b = builder.ReplicaBuilder
    for owner, name, label in (
            (builder, "table_exists", "apply: table_exists"),
            (b, "_detail", "apply: _detail (props, files)"),
            (builder, "txn_version", "apply: txn_version"),
            (b, "_ensure_view", "apply: _ensure_view"),
            (builder, "survey_batch", "apply: survey_batch"),
            (builder, "read_ddl", "apply: read_ddl"),
            (b, "_prepare_tables", "apply: _prepare_tables"),
            (builder, "replica_sources", "apply:   replica_sources"),
            (builder, "record_sources", "apply:   record_sources"),
            (b, "_source_columns", "apply: _source_columns"),
            (builder, "arrow_applies", "apply: arrow_applies"),
            (b, "_arrow_apply", "apply: _arrow_apply"),
            (builder, "batch_changes", "apply:   batch_changes"),
            (builder, "arrow_rows", "apply:   arrow_rows"),
            (builder, "open_log", "apply:   open_log"),
            (builder, "commit_arrow", "apply:   commit_arrow"),
            (builder, "purge_tombstones", "apply:   purge_tombstones"),
            (getattr(builder, "replica_merge", None), "merge_replica",
             "apply: merge_replica (Spark)"),
            (b, "_commit_empty", "apply: _commit_empty"),
            (arrow_commit, "commit_arrow", "apply:   commit_arrow"),
            (arrow_apply, "arrow_rows", "apply:   arrow_rows"),
            (replica_follower, "replica_table_metadata", "follower: replica_table_metadata"),
            (table_metadata, "delta_column_schema", "follower:   delta_column_schema"),
            (delta_log, "table_location", "any: table_location"),
            (plan, "replicas_touched", "round: replicas_touched"),
            (changelog_reader, "changelog_version", "round: changelog_version"),
            (replica_follower, "replica_metadata", "report: replica_metadata"),
            (replica_follower, "source_delay_check", "report: source_delay_check"),
            (replica_versions.InSync, "applied", "report: InSync.applied"),
            (replica_versions.InSync, "due", "report: InSync.due (in-sync reports)"),
            (replica_versions, "changelog_cursor", "report:   changelog_cursor"),
            (replica_follower._Checks, "applied", "check: _Checks.applied"),
            (replica_follower, "counted_rows", "check: counted_rows (Spark count)"),
            (replica_follower, "row_count_check", "check: row_count_check (incl. LiveKeys)"),
            (audit_arrow.LiveKeys, "count", "check:   LiveKeys.count"),
    ):
        t.wrap(owner, name, label)

    original_apply = b.apply

    def apply(self: builder.ReplicaBuilder, *args: object, **kwargs: object) -> object:
        began = time.perf_counter()
        profile = cProfile.Profile() if r.profiling else None
        if profile is not None:
            profile.enable()
        try:
            return original_apply(self, *args, **kwargs)
        finally:
            if profile is not None:
                profile.disable()
                with r.lock:
                    r.threads.append(profile)
            t.add("APPLY ReplicaBuilder.apply", time.perf_counter() - began)

    b.apply = apply

    wanted = replica_follower.pool_wanted

    def pool_wanted(instance: dg.DagsterInstance, own_run_id: str) -> bool:
        began = time.perf_counter()
        wanted(instance, own_run_id)
        t.add("round: pool_wanted (stop check)", time.perf_counter() - began)
        return r.stop(measuring[0])

    replica_follower.pool_wanted = pool_wanted

    follow = replica_follower.follow

    def timed_follow(*args: object, **kwargs: object) -> Iterator:
        # The op's side: time waiting in the loop (applies in flight), and time handling
        # each item it yields (reports, Dagster's event writes) before asking for the next.
        gen = follow(*args, **kwargs)
        while True:
            began = time.perf_counter()
            try:
                item = next(gen)
            except StopIteration:
                return
            t.add("OP waiting on the loop (applies)", time.perf_counter() - began)
            began = time.perf_counter()
            yield item
            kind = "a poll" if item[0] is None else "an apply"
            t.add(f"OP handling {kind} (reports, events)", time.perf_counter() - began)

    replica_follower.follow = timed_follow

    due = replica_follower._Checks.due

    def end_checks(self: replica_follower._Checks, now: float | None,
                   only: str | None = None) -> Iterator:
        # The run's end checks every pending replica, a Spark count each: a sample here
        # (none after the build), to keep the bench short.
        if now is None:
            keep = sorted(self.pending)[:r.end_checks if measuring[0] else 0]
            self.pending = {n: self.pending[n] for n in keep}
        return due(self, now, only)

    replica_follower._Checks.due = end_checks

    handle = dg.DagsterInstance.handle_new_event

    def handle_new_event(self: dg.DagsterInstance, event: object, **kwargs: object) -> object:
        began = time.perf_counter()
        try:
            return handle(self, event, **kwargs)
        finally:
            kind = event.dagster_event.event_type_value if event.dagster_event else "LOG"
            t.add(f"EVENT write {kind}", time.perf_counter() - began)

    dg.DagsterInstance.handle_new_event = handle_new_event


def pipeline_config(work: Path, replicas: int) -> PipelineConfig:
    return parse_config({
        "kafka": {"bootstrap.servers": "127.0.0.1:9", "group.id": "bench-replica-round"},
        "lakehouse": {"path": str(work / "lakehouse"), "database": "replica_round"},
        "dagster": {"replica_follow_seconds": 600, "replica_poll_seconds": 0.05},
        "sources": [{"name": "src", "topics": ["binlog"], "format": "debezium",
                     "tables": [{"source": f"shop.t{i}", "replica": f"t{i}"}
                                for i in range(replicas)]}],
    })


def recorded(instance: dg.DagsterInstance, pipeline: PipelineConfig, count: int) -> None:
    """Changelog materializations as consumer runs record them, each naming the version
    it wrote: what a follower's cursor lookups read in a busy deployment."""
    from binlog_assets.lakehouse.changelog_reader import changelog_version
    from binlog_assets.orchestration.partitions import CHANGELOG_ASSET_KEY

    version = changelog_version(None, pipeline)
    for i in range(count):
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=CHANGELOG_ASSET_KEY, partition=f"binlog:{i % 100}",
            metadata={"changelog_version": dg.MetadataValue.int(version)}))


def run(instance: dg.DagsterInstance, resource: BinlakeResource) -> float:
    from binlog_assets.orchestration.replica_follower import follow_replicas_job

    began = time.perf_counter()
    result = follow_replicas_job.execute_in_process(
        instance=instance, resources={"binlake": resource},
        run_config={"ops": {"follow_replicas": {"config": {"seconds": 600}}}})
    if not result.success:
        raise RuntimeError("the follower run failed")
    return time.perf_counter() - began


def show(title: str, seconds: dict[str, float], calls: dict[str, int], wall: float,
         replicas: int) -> None:
    print(f"\n{title}: {wall:.2f}s wall, {1000 * wall / replicas:.1f} ms/replica")
    order = ("OP", "APPLY", "apply", "follower", "check", "report", "EVENT", "round", "any")
    for label in sorted(seconds, key=lambda k: (next((i for i, p in enumerate(order)
                                                       if k.startswith(p)), 99), k)):
        s, n = seconds[label], calls[label]
        print(f"  {label:44s} {s:7.3f}s {n:5d} calls {1000 * s / replicas:7.1f} ms/replica"
              f" {1000 * s / max(n, 1):7.1f} ms/call")


def profile_top(profiles: list[cProfile.Profile], top: int, title: str) -> None:
    if not profiles:
        return
    out = io.StringIO()
    stats = pstats.Stats(profiles[0], stream=out)
    for p in profiles[1:]:
        stats.add(p)
    stats.sort_stats("cumulative").print_stats(top)
    print(f"\n{title}")
    # The table only: the header's file list says nothing here.
    text = out.getvalue()
    print(text[text.find("   ncalls"):].rstrip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=100)
    parser.add_argument("--rows", type=int, default=3)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--changelog-events", type=int, default=200,
                        help="changelog materializations in the instance (consumer runs' "
                             "reports, which each apply's cursor looks back over)")
    parser.add_argument("--end-checks", type=int, default=10,
                        help="pending checks the measured run's end does (of --replicas)")
    parser.add_argument("--snapshot", action="store_true",
                        help="the first commit ends each table's rows with a truncate below "
                             "them, as a snapshot's end does: every replica holds a marker")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="binlake-replica-round-"))
    try:
        pipeline = pipeline_config(work, args.replicas)
        (work / "binlake.yaml").write_text(pipeline.model_dump_json(exclude_none=True))
        resource = BinlakeResource(config_path=str(work / "binlake.yaml"))
        home = work / "dagster"
        home.mkdir()
        shutil.copy(REPO_ROOT / "setup" / "dagster.yaml", home / "dagster.yaml")

        sources = [Source(f"shop.t{i}") for i in range(args.replicas)]
        part = Partition(ChangelogWriter(pipeline))
        ids = [0]

        def commit() -> None:
            # One changelog commit touching every table: new keys, and an update of one.
            records = []
            for source in sources:
                if args.snapshot and not ids[0]:
                    records.append([source.truncate()])
                for j in range(args.rows):
                    records.append([source.insert(row(ids[0] + j))])
                if ids[0]:
                    records.append(source.update(row(0), row(0, note=f"v{ids[0]}")))
            ids[0] += args.rows
            part.write(part.records(records))

        commit()
        timings = Timings()
        measuring = [False]
        r = Round(timings, commit)
        r.end_checks = args.end_checks
        instrument(timings, r, measuring)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            began = time.perf_counter()
            built = run(instance, resource)
            print(f"build run (Spark start, {args.replicas} new replicas, their checks): "
                  f"{built:.1f}s")
            recorded(instance, pipeline, args.changelog_events)
            measuring[0] = True
            r.start_run()
            timings.reset()
            wall = run(instance, resource)
            show("measured round (all replicas touched)", *r.round, r.ended - r.began,
                 args.replicas)
            show(f"after the round: the run's end ({args.end_checks} pending checks)",
                 dict(timings.seconds), dict(timings.calls), time.perf_counter() - r.ended,
                 args.replicas)
            print(f"\nrun: {wall:.1f}s wall; both runs {time.perf_counter() - began:.1f}s")
        profile_top([r.main], args.top, "profile of the round, op thread (cumulative)")
        profile_top(r.threads, args.top // 2, "profile of the round's applies, their "
                    "threads merged (cumulative)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
