"""E3's binlake side as the shipped automation runs a catch-up: the replica follower
applies the replicas while the consume is still writing the changelog, instead of after
it. Used by `bench_catchup.py --follow`.

The follower here is the product's `follow()` loop (as `follow_replicas` drives it: every
replica in its first round, then those the new changelog versions touch),
`spark.parallel_replicas` builders at a time; the consume is `consume_partitions`, as in
the sequential mode, in a thread beside it. Spark starts at once, beside the consume.

Also the host's busy CPU time (`/proc/stat`, every process: the broker's share too) for
each part, so a figure says whether the parts had cores to overlap on.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from queue import Queue

from binlog_assets.config import PipelineConfig
from binlog_assets.lakehouse.changelog_reader import changelog_version
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.lakehouse.replica.plan import replicas_touched
from binlog_assets.lakehouse.replica.routes import replica_routes
from binlog_assets.lakehouse.spark import get_spark
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.orchestration.replica_follower import ChangelogView, FollowOptions, follow
from binlog_assets.rounds.round import consume_partitions

FOLLOW_POLL = 0.5  # seconds between the follower's looks at the changelog's version
DEADLINE = 1800.0  # seconds: a follower that never catches up fails the bench


def busy_seconds() -> float:
    """CPU seconds the host's cores have been busy since boot (all processes)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is inside user)
    busy = sum(fields[:3]) + sum(fields[5:8])
    return busy / os.sysconf("SC_CLK_TCK")


@dataclass
class Followed:
    total: float  # from the start to every replica holding every row
    consume: float  # the consume's own wall time, from the start
    spark_ready: float  # from the start to Spark's session and catalog being up
    tail: float  # after the consume ended, until every replica held every row
    applies: int  # apply calls, those that found nothing included
    rounds: int
    busy: float  # host CPU seconds over `total`
    busy_consume: float  # host CPU seconds while the consume ran

    def line(self) -> str:
        return (f"total {self.total:.2f}s: consume {self.consume:.2f}s beside Spark's start "
                f"({self.spark_ready:.2f}s) and the follower ({self.applies} applies in "
                f"{self.rounds} rounds), then {self.tail:.2f}s until every replica held "
                f"every row; host busy {self.busy:.1f} CPU s "
                f"({self.busy / self.total:.2f} cores), {self.busy_consume:.1f} of them "
                f"while the consume ran ({self.busy_consume / self.consume:.2f} cores)")


def binlake_following(pipeline: PipelineConfig, keys: list[str], expected: dict[str, int],
                      parallel: int, group: str) -> Followed:
    """Consume the partitions `keys` while the follower applies; done when each replica
    has applied the changelog rows `expected` names for it."""
    names = list(expected)
    began, busy0 = time.perf_counter(), busy_seconds()
    consumed: dict[str, object] = {}

    def consume() -> None:
        try:
            consumed["outcomes"] = consume_partitions(pipeline, dict(pipeline.kafka), keys,
                                                      ChangelogRunConfig(), group=group)
        except BaseException as error:
            consumed["error"] = error
        finally:
            consumed["at"], consumed["busy"] = time.perf_counter(), busy_seconds()

    thread = threading.Thread(target=consume, name="consume")
    thread.start()
    spark = get_spark(pipeline)
    spark.catalog.tableExists(f"{pipeline.lakehouse.database}.changelog")
    ready = time.perf_counter()
    builders: Queue[ReplicaBuilder] = Queue()
    for _ in range(parallel):
        builders.put(ReplicaBuilder(spark, pipeline))

    def apply(name: str, version: int) -> object:
        builder = builders.get()
        try:
            return builder.apply(name, up_to_version=version)
        finally:
            builders.put(builder)

    rows: Counter[str] = Counter()
    applies = rounds = 0
    deadline = time.monotonic() + DEADLINE

    def stop() -> bool:
        if "error" in consumed:
            raise RuntimeError("the consume failed") from consumed["error"]
        if time.monotonic() > deadline:
            raise TimeoutError(f"replicas behind after {DEADLINE:.0f}s: "
                               f"{[n for n in names if rows[n] != expected[n]][:5]}")
        return not thread.is_alive() and all(rows[n] == expected[n] for n in names)

    routes = replica_routes(pipeline)
    changelog = ChangelogView(
        lambda: changelog_version(None, pipeline),
        lambda after, up_to: replicas_touched(pipeline, routes, after, up_to))
    for name, result in follow(apply, names, changelog=changelog,
                               options=FollowOptions(poll=FOLLOW_POLL, workers=parallel,
                                                     rounds=True), stop=stop):
        if name is None:
            rounds += 1
            continue
        if isinstance(result, Exception):
            raise RuntimeError(f"replica {name}") from result
        applies += 1
        if not result.skipped:
            rows[name] += result.rows
        if rows[name] > expected[name]:
            raise RuntimeError(f"replica {name} applied {rows[name]} rows, "
                               f"expected {expected[name]}")
    thread.join()
    end, busy1 = time.perf_counter(), busy_seconds()
    failed = [o for o in consumed["outcomes"] if o.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} partitions failed, first {failed[0].key}")
    return Followed(total=end - began, consume=consumed["at"] - began,
                    spark_ready=ready - began, tail=end - consumed["at"], applies=applies,
                    rounds=rounds, busy=busy1 - busy0, busy_consume=consumed["busy"] - busy0)
