"""Drill: SIGKILL of the consumer run at each commit boundary, then a rerun; 0 loss.

Boundaries (binlog_assets/faults.py): after fetch, after a dead letter's send (before
the broker acknowledges it), after handlers, after the changelog commit, after the Kafka
commit, after the metadata write (the Dagster materialization), during a replica MERGE.
Each trial writes new changes in MariaDB, among them customers the drill's handler
always fails on (`drill_handlers.POISON_NAME`, so dead letters are in flight in every
trial), waits for Debezium, and starts `drill_child.py` (Dagster materializations of the
changelog asset for the 5 shop topic-partitions, then the replicas) with `BINLAKE_FAULT`
set to the boundary, the hit number and, for the MERGE, a delay drawn from the seeded
generator: the child and its Spark JVM are SIGKILLed there. The next trial's child is
the rerun of the killed one: it resumes from whatever the crash left (changelog
transaction state, Dagster metadata, Kafka's committed offset, dead letters sent but not
acknowledged, half-applied replicas). After every kill the changelog is checked for
duplicate coordinates and the dead-letter topic is counted; after the last trial a clean
child catches up and the drill compares the changelog with every event of the topics
(each exactly once, the dead-lettered ones too: the changelog records every event,
handled or not), each replica with its source table (row for row), and the dead-letter
topic with the poisoned events (each at least once: a crash may send one twice, never
lose one).

The drill's lakehouse and Dagster instance are its own (a temporary directory): its
children run their own Spark JVM and embedded Derby catalog, which the session's Spark
must not hold, so the test reads their tables by path. The short variant (1 trial per
boundary) runs in `make test`; `make drills-long` runs 3 per boundary
(`BINLAKE_DRILL_TRIALS` overrides either).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml
from drill_handlers import POISON_NAME, POISON_TABLE, poisoned
from drill_lib import (
    KEYS,
    REPLICAS,
    changelog_coordinates,
    coordinate_diff,
    dead_letter_coordinates,
    kafka_events,
    shop_config,
    wait_published,
    workload,
)
from pyspark.sql import functions as F

from binlog_assets.config import PipelineConfig
from binlog_assets.dev import drills, shop
from binlog_assets.dev.connect import DebeziumFence
from binlog_assets.dev.kafka import create_topics
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.faults import ENV_DELAY, ENV_HIT, ENV_POINT, MARKER, POINTS

CHILD = Path(__file__).with_name("drill_child.py")
SEED = 606
# Poisoned customers written per trial: the dead-letter boundary's hit is 1 or 2.
POISONED_PER_TRIAL = 2


def _trials(default: int) -> int:
    return int(os.environ.get("BINLAKE_DRILL_TRIALS") or default)


# The short variant reads two of the shop's partitions (each child pays a Spark JVM and
# its catalog; on 2 shared cores that is most of its time); the long one all five.
SHORT_KEYS = tuple(k for k in KEYS if k.split(":")[0] in ("shop.shop.customers",
                                                          "shop.shop.products"))


# Every child starts a Spark JVM: on 2 shared cores a child takes 0.5 to 3 minutes.
@pytest.mark.timeout(2400)
def test_sigkill_at_each_commit_boundary(debezium_fence, mariadb, pipeline_config, spark,
                                         tmp_path) -> None:
    _sigkill_drill(_trials(1), "sigkill_commit_boundaries", SHORT_KEYS,
                   ("customers", "products"), mariadb, debezium_fence, pipeline_config, spark,
                   tmp_path)


@pytest.mark.long
@pytest.mark.timeout(7200)
def test_sigkill_at_each_commit_boundary_long(debezium_fence, mariadb, pipeline_config,
                                              spark, tmp_path) -> None:
    _sigkill_drill(_trials(3), "sigkill_commit_boundaries_long", KEYS, REPLICAS, mariadb,
                   debezium_fence, pipeline_config, spark, tmp_path)


def _sigkill_drill(trials: int, name: str, keys: tuple[str, ...], replicas: tuple[str, ...],
                   mariadb: MariaDBServer, fence: DebeziumFence, pipeline_config: PipelineConfig,
                   spark,
                   tmp_path: Path) -> None:
    began = time.monotonic()
    lake = tmp_path / "lake"
    home = tmp_path / "dagster_home"
    home.mkdir()
    # A dead-letter topic of the drill's own: the other drill variant's dead letters,
    # written to the same broker, must not count here.
    dlq = f"drills.dlq.{name}-{uuid.uuid4().hex[:6]}"
    pipeline = shop_config(pipeline_config, "drills", lakehouse=lake, lanes=8,
                      dead_letter_topic=dlq, handlers="drill_handlers:registry")
    config_path = tmp_path / "binlake.yaml"
    config_path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_none=True)))
    kafka_conf = dict(pipeline.kafka)
    create_topics(kafka_conf["bootstrap.servers"], [dlq])
    env = {**os.environ, "DAGSTER_HOME": str(home), "BINLAKE_CONFIG": str(config_path)}
    for var in (ENV_POINT, ENV_HIT, ENV_DELAY):
        env.pop(var, None)
    tables = lake / "warehouse" / f"{pipeline.lakehouse.database}.db"

    def child(replica_names: tuple[str, ...] = replicas, **fault: str
              ) -> tuple[int, str, str, float]:
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, str(CHILD), str(config_path), ",".join(keys),
             ",".join(replica_names)],
            env={**env, **fault}, capture_output=True, text=True, timeout=1200)
        return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0

    def changelog() -> Path:
        return tables / "changelog"

    conn = mariadb.connect()
    rng = random.Random(SEED)
    per_point = {p: {"trials": 0, "kills": 0, "not_reached": 0, "duplicates_after_kill": 0,
                     "dead_letters": 0, "dead_letter_duplicates": 0,
                     "child_seconds": 0.0} for p in POINTS}
    letters: Counter = Counter()
    log: list[dict] = []
    plan = [p for _ in range(trials) for p in POINTS]
    for i, point in enumerate(plan):
        workload(conn, SEED * 1000 + i, 30)
        _write_poisoned(conn, POISONED_PER_TRIAL)
        wait_published(kafka_conf, fence)
        hit = rng.randint(1, 2)
        merge = point == "during_replica_merge"
        delay = round(rng.uniform(0.0, 2.0), 2) if merge else 0.0
        # A child killed before the replicas would not build them: only the MERGE's does.
        rc, out, err, seconds = child(replicas if merge else (),
                                      **{ENV_POINT: point, ENV_HIT: str(hit),
                                         ENV_DELAY: str(delay)})
        killed = rc == -9 and f"{MARKER} {point}" in err
        figures = per_point[point]
        figures["trials"] += 1
        figures["child_seconds"] += round(seconds, 1)
        if killed:
            figures["kills"] += 1
        else:
            # The boundary was met fewer than `hit` times: the child finished cleanly.
            assert rc == 0, f"{point} (hit {hit}): child died with {rc}:\n{err[-3000:]}"
            figures["not_reached"] += 1
        dups = 0
        if (tables / "changelog" / "_delta_log").exists():
            dups = coordinate_diff({}, changelog_coordinates(changelog()))["duplicates"]
        figures["duplicates_after_kill"] += dups
        # Dead letters this trial's child sent (acknowledged), and how many of them were
        # sent before (a rerun redoing an event whose dead letter was not committed past).
        before, letters = letters, dead_letter_coordinates(kafka_conf, dlq)
        sent, again = _letters_since(before, letters)
        figures["dead_letters"] += sent
        figures["dead_letter_duplicates"] += again
        log.append({"trial": i, "point": point, "hit": hit, "delay": delay, "killed": killed,
                    "seconds": round(seconds, 1), "changelog_duplicates": dups,
                    "dead_letters": sent, "dead_letter_duplicates": again})
        print(f"\n{point} hit {hit} delay {delay}: {'killed' if killed else 'not reached'} "
              f"after {seconds:.0f}s; changelog duplicates {dups}; dead letters {sent} "
              f"({again} again)", flush=True)

    ends = {k: e for k, e in wait_published(kafka_conf, fence).items() if k in keys}
    rc, out, err, seconds = child()
    assert rc == 0, f"the rerun failed with {rc}:\n{err[-4000:]}"
    result = json.loads(next(line for line in out.splitlines()
                             if line.startswith("DRILL-RESULT "))[len("DRILL-RESULT "):])
    model: Counter = Counter()
    poison: Counter = Counter()  # (topic, partition, offset) -> events the handler fails
    for e in kafka_events(kafka_conf, ends):
        model[(e.topic, e.partition, e.offset, e.row_index)] += 1
        if poisoned(e):
            poison[(e.topic, e.partition, e.offset)] += 1
    in_changelog = changelog_coordinates(changelog())
    diff = coordinate_diff(model, in_changelog)
    before, letters = letters, dead_letter_coordinates(kafka_conf, dlq)
    rerun_sent, rerun_again = _letters_since(before, letters)
    dead = {
        "poisoned_events": sum(poison.values()),
        "records": sum(letters.values()),
        # At least once: a poisoned event with no dead letter is lost.
        "missing": sum(n - letters[c] for c, n in poison.items() if letters[c] < n),
        "duplicates": sum(n - poison[c] for c, n in letters.items()
                          if c in poison and n > poison[c]),
        "unexpected": sum(n for c, n in letters.items() if c not in poison),
        # The changelog records every event, dead-lettered or handled.
        "in_changelog": sum(1 for (t, p, o, _r) in in_changelog if (t, p, o) in poison),
        "rerun_sent": rerun_sent, "rerun_duplicates": rerun_again,
    }

    def live(replica: str):
        return (spark.read.format("delta").load(str(tables / replica))
                .where(~F.col("_op").isin("d", "t")))

    comparisons = [_compare(conn, spark, r, live(r)) for r in replicas]
    kills = sum(f["kills"] for f in per_point.values())
    figures = {
        "seed": SEED, "trials_per_boundary": trials, "partitions": list(keys),
        "trials": len(plan), "kills": kills,
        "per_boundary": per_point, "rerun_seconds": round(seconds, 1),
        "rerun_committed": {k: r["committed_offset"] for k, r in result["runs"].items()},
        "rerun_checkpoint_sources": {k: r["checkpoint_source"]
                                     for k, r in result["runs"].items()},
        "end_offsets": ends,
        "changelog_events": sum(changelog_coordinates(changelog()).values()),
        "changelog_missing": diff["missing"], "changelog_duplicates": diff["duplicates"],
        "changelog_unexpected": diff["unexpected"],
        "dead_letter_topic": dlq, "dead_letters": dead,
        "rerun_dead_lettered": {k: r.get("dead_lettered") for k, r in result["runs"].items()},
        "rows_compared": sum(c.source_rows + c.replica_rows for c in comparisons),
        "mismatches": sum(c.mismatched + abs(c.source_rows - c.replica_rows)
                          for c in comparisons),
        "per_table": {c.replica: [c.source_rows, c.replica_rows, c.mismatched]
                      for c in comparisons},
        "seconds": round(time.monotonic() - began, 1),
        "log": log,
    }
    drills.record(name, figures)
    print(f"\n{name}: {kills} kills in {len(plan)} trials; rerun {seconds:.0f}s; changelog "
          f"{diff}; dead letters {dead}; "
          + "; ".join(f"{c.replica} {c.source_rows}/{c.replica_rows}/{c.mismatched}"
                      for c in comparisons))

    assert all(f["kills"] >= 1 for f in per_point.values()), per_point
    assert all(f["duplicates_after_kill"] == 0 for f in per_point.values()), per_point
    assert {k: r["committed_offset"] for k, r in result["runs"].items()} == ends
    assert diff == {"missing": 0, "unexpected": 0, "duplicates": 0}, diff
    assert dead["poisoned_events"] >= POISONED_PER_TRIAL * len(plan), dead
    assert dead["missing"] == 0 and dead["unexpected"] == 0, dead
    assert dead["in_changelog"] == dead["poisoned_events"], dead
    for c in comparisons:
        assert c.source_rows > 0 and c.matches, c


def _write_poisoned(conn, rows: int) -> None:
    """Customers the drill's handler always fails on, with ids no workload uses."""
    with conn.cursor() as cur:
        cur.execute("SELECT COALESCE(MAX(id), 999) FROM shop.customers WHERE id >= 1000")
        (top,) = cur.fetchone()
        for n in range(top + 1, top + 1 + rows):
            cur.execute(f"INSERT INTO {POISON_TABLE} (id, name, email) VALUES (%s, %s, %s)",
                        (n, POISON_NAME, f"poison-{n}@example.com"))


def _letters_since(before: Counter, now: Counter) -> tuple[int, int]:
    """Dead letters sent since `before`, and how many of them repeat a coordinate."""
    sent = sum(now.values()) - sum(before.values())
    again = sum(now[c] - max(before[c], 1) for c in now if now[c] > max(before[c], 1))
    return sent, again


def _compare(conn, spark, replica: str, frame) -> shop.TableComparison:
    src = shop.source_rows(conn, replica)
    rep = shop.replica_rows(spark, "", replica, frame)
    return shop.TableComparison(replica, len(src), len(rep), len(src ^ rep))
