"""Drill: SIGKILL of the consumer run at each commit boundary, then a rerun; 0 loss.

Boundaries (binlog_assets/faults.py): after fetch, after handlers, after the changelog
commit, after the Kafka commit, after the metadata write (the Dagster materialization),
during a replica MERGE. Each trial writes new changes in MariaDB, waits for Debezium,
and starts `drill_child.py` (Dagster materializations of the changelog asset for the 5
shop topic-partitions, then the replicas) with `BINLAKE_FAULT` set to the boundary, the
hit number and, for the MERGE, a delay drawn from the seeded generator: the child and
its Spark JVM are SIGKILLed there. The next trial's child is the rerun of the killed
one: it resumes from whatever the crash left (changelog transaction state, Dagster
metadata, Kafka's committed offset, half-applied replicas). After every kill the
changelog is checked for duplicate coordinates; after the last trial a clean child
catches up and the drill compares the changelog with every event of the topics (each
exactly once) and each replica with its source table (row for row).

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
from pathlib import Path

import pytest
import yaml
from drill_lib import (
    KEYS,
    REPLICAS,
    changelog_coordinates,
    coordinate_diff,
    kafka_model,
    shop_config,
    wait_published,
    workload,
)
from pyspark.sql import functions as F

from binlog_assets.config import PipelineConfig
from binlog_assets.dev import drills, shop
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.faults import ENV_DELAY, ENV_HIT, ENV_POINT, MARKER, POINTS

CHILD = Path(__file__).with_name("drill_child.py")
SEED = 606


def _trials(default: int) -> int:
    return int(os.environ.get("BINLAKE_DRILL_TRIALS") or default)


# The short variant reads two of the shop's partitions (each child pays a Spark JVM and
# its catalog; on 2 shared cores that is most of its time); the long one all five.
SHORT_KEYS = tuple(k for k in KEYS if k.split(":")[0] in ("shop.shop.customers",
                                                          "shop.shop.products"))


# Every child starts a Spark JVM: on 2 shared cores a child takes 0.5 to 3 minutes.
@pytest.mark.timeout(2400)
def test_sigkill_at_each_commit_boundary(debezium_connect, mariadb, pipeline_config, spark,
                                         tmp_path) -> None:
    _sigkill_drill(_trials(1), "sigkill_commit_boundaries", SHORT_KEYS,
                   ("customers", "products"), mariadb, pipeline_config, spark, tmp_path)


@pytest.mark.long
@pytest.mark.timeout(7200)
def test_sigkill_at_each_commit_boundary_long(debezium_connect, mariadb, pipeline_config,
                                              spark, tmp_path) -> None:
    _sigkill_drill(_trials(3), "sigkill_commit_boundaries_long", KEYS, REPLICAS, mariadb,
                   pipeline_config, spark, tmp_path)


def _sigkill_drill(trials: int, name: str, keys: tuple[str, ...], replicas: tuple[str, ...],
                   mariadb: MariaDBServer, pipeline_config: PipelineConfig, spark,
                   tmp_path: Path) -> None:
    began = time.monotonic()
    lake = tmp_path / "lake"
    home = tmp_path / "dagster_home"
    home.mkdir()
    cfg = shop_config(pipeline_config, "drills", lakehouse=lake, lanes=8)
    config_path = tmp_path / "binlake.yaml"
    config_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    kafka_conf = dict(cfg.kafka)
    env = {**os.environ, "DAGSTER_HOME": str(home), "BINLAKE_CONFIG": str(config_path)}
    for var in (ENV_POINT, ENV_HIT, ENV_DELAY):
        env.pop(var, None)
    tables = lake / "warehouse" / f"{cfg.lakehouse.database}.db"

    def child(replica_names: tuple[str, ...] = replicas, **fault: str
              ) -> tuple[int, str, str, float]:
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, str(CHILD), str(config_path), ",".join(keys),
             ",".join(replica_names)],
            env={**env, **fault}, capture_output=True, text=True, timeout=1200)
        return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0

    def changelog():
        return spark.read.format("delta").load(str(tables / "changelog"))

    conn = mariadb.connect()
    rng = random.Random(SEED)
    per_point = {p: {"trials": 0, "kills": 0, "not_reached": 0, "duplicates_after_kill": 0,
                     "child_seconds": 0.0} for p in POINTS}
    log: list[dict] = []
    plan = [p for _ in range(trials) for p in POINTS]
    for i, point in enumerate(plan):
        workload(conn, SEED * 1000 + i, 30)
        wait_published(kafka_conf, settle=1.5)
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
        log.append({"trial": i, "point": point, "hit": hit, "delay": delay, "killed": killed,
                    "seconds": round(seconds, 1), "changelog_duplicates": dups})
        print(f"\n{point} hit {hit} delay {delay}: {'killed' if killed else 'not reached'} "
              f"after {seconds:.0f}s; changelog duplicates {dups}", flush=True)

    ends = {k: e for k, e in wait_published(kafka_conf, settle=2.0).items() if k in keys}
    rc, out, err, seconds = child()
    assert rc == 0, f"the rerun failed with {rc}:\n{err[-4000:]}"
    result = json.loads(next(line for line in out.splitlines()
                             if line.startswith("DRILL-RESULT "))[len("DRILL-RESULT "):])
    diff = coordinate_diff(kafka_model(kafka_conf, ends), changelog_coordinates(changelog()))

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
          f"{diff}; " + "; ".join(f"{c.replica} {c.source_rows}/{c.replica_rows}"
                                  f"/{c.mismatched}" for c in comparisons))

    assert all(f["kills"] >= 1 for f in per_point.values()), per_point
    assert all(f["duplicates_after_kill"] == 0 for f in per_point.values()), per_point
    assert {k: r["committed_offset"] for k, r in result["runs"].items()} == ends
    assert diff == {"missing": 0, "unexpected": 0, "duplicates": 0}, diff
    for c in comparisons:
        assert c.source_rows > 0 and c.matches, c


def _compare(conn, spark, replica: str, frame) -> shop.TableComparison:
    src = shop.source_rows(conn, replica)
    rep = shop.replica_rows(spark, "", replica, frame)
    return shop.TableComparison(replica, len(src), len(rep), len(src ^ rep))
