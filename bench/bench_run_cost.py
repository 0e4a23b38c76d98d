"""E2: the fixed cost of a consumer run, as a user launches one (`dagster job execute`).

Each round produces 10 Debezium records to a fresh topic's partition and times, wall
clock, one Dagster run of `consume_changelog_job` over that partition (a new process:
Python, the code location, the run, the changelog commit with delta-rs, the Kafka
commit) against one run of a no-op asset in the same code location
(`run_cost_location.py`: binlake's definitions plus `noop_job`). Rounds alternate the
two; the ratio of their medians is printed against the target of 1.5.

    .venv/bin/python bench/bench_run_cost.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg
import yaml
from harness import create_topic, load_average, produce_debezium, running_broker

from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME, partition_key

TARGET = 1.5
HERE = Path(__file__).resolve().parent
DAGSTER = str(Path(sys.executable).with_name("dagster"))


def timed_run(job: str, env: dict[str, str], tags: dict[str, str] | None = None) -> float:
    cmd = [DAGSTER, "job", "execute", "-f", str(HERE / "run_cost_location.py"), "-a", "defs",
           "-j", job]
    if tags:
        cmd += ["--tags", json.dumps(tags)]
    began = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - began
    if proc.returncode != 0:
        raise RuntimeError(f"{job} exited {proc.returncode}: {proc.stderr[-3000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=10)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="binlake-run-cost-"))
    with running_broker() as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, "runcost")
        pipeline = {
            "kafka": {"bootstrap.servers": bootstrap, "group.id": "bench-run-cost",
                      "auto.offset.reset": "earliest", "isolation.level": "read_committed"},
            "lakehouse": {"path": str(work / "lakehouse"), "database": "runcost"},
            "sources": [{"name": "bench", "topics": [topic], "format": "debezium",
                         "tables": [{"source": "shop.orders", "replica": "orders"}]}],
        }
        (work / "binlake.yaml").write_text(yaml.safe_dump(pipeline))
        home = work / "dagster"
        home.mkdir()
        key = partition_key(topic, 0)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, [key])
        env = {**os.environ, "BINLAKE_CONFIG": str(work / "binlake.yaml"),
               "DAGSTER_HOME": str(home)}
        consume: list[float] = []
        noop: list[float] = []
        for i in range(args.rounds):
            produce_debezium(bootstrap, topic, args.records, args.records, seed=i,
                             first_id=i * args.records, expect_end=(i + 1) * args.records)
            consume.append(timed_run("consume_changelog_job", env, {"dagster/partition": key}))
            noop.append(timed_run("noop_job", env))
            print(f"round {i + 1}: consume {consume[-1]:.2f}s, no-op {noop[-1]:.2f}s; "
                  f"{load_average()}", flush=True)
    c, n = statistics.median(consume), statistics.median(noop)
    ratio = c / n
    print(f"\nconsume run of {args.records} records: median {c:.2f}s "
          f"(min {min(consume):.2f}s); no-op run: median {n:.2f}s (min {min(noop):.2f}s)")
    print(f"ratio consume / no-op = {ratio:.2f} (target <= {TARGET}): "
          f"{'met' if ratio <= TARGET else 'MISSED'}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
