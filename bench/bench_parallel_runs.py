"""Parallel consumer runs: catch-up events/s with 1, 2 and 4 concurrent runs.

The backlog is `bench_catchup.py`'s (Debezium change events over `--topics` topics, 50 by
default, one partition each). For each count N of runs, the topic-partitions are split
into N equal batches, as the lag sensor splits lagging partitions with
`dagster.max_partitions_per_run` and the queued run coordinator runs them side by side
(`max_concurrent_runs`); each batch is one process, as each Dagster run is, doing what
the changelog asset's step does (`consume_partitions` into the changelog, delta-rs,
no Spark), under a fresh consumer group and lakehouse. Printed per N: wall seconds from
the first run's start to the last run's end, events/s, the speed-up against one run
(the baseline, same backlog, same process shape), and each run's CPU share (its user +
system CPU seconds over the wall time: 1.0 is one core busy throughout).

    .venv/bin/python bench/bench_parallel_runs.py                       # 200,000 over 50
    .venv/bin/python bench/bench_parallel_runs.py --events 50000 --runs 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from bench_catchup import pipeline_config, produce, topic_name
from harness import load_average, rate, running_broker, warm_group_coordinator

from binlog_assets.dev.kafka import create_topics

_RUN = """
import json, sys, time
from binlog_assets.config import parse_config
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.rounds.round import RoundOptions, consume_partitions
pipeline = parse_config(json.loads(sys.argv[1]))
keys = sys.argv[2].split(",")
began = time.perf_counter()
outcomes = consume_partitions(pipeline, dict(pipeline.kafka), keys, ChangelogRunConfig(),
                              group=sys.argv[3], options=RoundOptions(handlers=HandlerRegistry()))
failed = [o for o in outcomes if o.error is not None]
if failed:
    raise SystemExit(f"{failed[0].key}: {failed[0].error!r}")
print(json.dumps({"events": sum(o.summary.events for o in outcomes),
                  "offsets": {o.key: o.summary.committed_offset for o in outcomes},
                  "seconds": time.perf_counter() - began}))
"""


def run_batches(pipeline: dict, keys: list[str], runs: int, group: str
                ) -> tuple[float, list[dict], list[float]]:
    """Start `runs` processes over equal shares of `keys`; (wall seconds, each run's
    result, each run's CPU seconds)."""
    batches = [keys[i::runs] for i in range(runs)]
    began = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", _RUN, json.dumps(pipeline), ",".join(b),
                               group], stdout=subprocess.PIPE, text=True)
             for b in batches]
    results, cpu = [], []
    for proc in procs:
        out = proc.stdout.read()  # to its end: the run has finished
        # wait4 gives this child's own rusage (not the sum of every child so far).
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise RuntimeError(f"a run failed ({proc.returncode}): {out[-2000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
        cpu.append(usage.ru_utime + usage.ru_stime)
    return time.perf_counter() - began, results, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--topics", type=int, default=50)
    parser.add_argument("--keys-per-table", type=int, default=2_000)
    parser.add_argument("--runs", default="1,2,4", help="concurrent run counts to measure")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    counts = [int(n) for n in args.runs.split(",")]

    root = tempfile.mkdtemp(prefix="binlake-bench-parallel-")
    rows = []
    try:
        with running_broker() as broker:
            bootstrap = broker.bootstrap_servers
            names = [topic_name(t) for t in range(args.topics)]
            create_topics(bootstrap, names)
            warm_group_coordinator(bootstrap, names[0])
            work = produce(bootstrap, args.events, args.topics, args.keys_per_table,
                           args.seed)
            keys = [f"{n}:0" for n in names]
            expected = {f"{topic_name(t)}:0": work.records[t] for t in range(args.topics)}
            for n in counts:
                pipeline = pipeline_config(bootstrap, os.path.join(root, f"lake-{n}"), args.topics)
                seconds, results, cpu = run_batches(
                    pipeline.model_dump(mode="json", exclude_none=True), keys, n,
                    f"bench-parallel-{n}-{os.getpid()}")
                offsets = {k: v for r in results for k, v in r["offsets"].items()}
                if offsets != expected:
                    raise RuntimeError(f"{n} runs committed {offsets}, expected {expected}")
                events = sum(r["events"] for r in results)
                rows.append((n, seconds, events, [c / seconds for c in cpu]))
                print(f"{n} run(s): {seconds:.2f}s, {rate(events, seconds):,.0f} events/s, "
                      f"CPU share per run {[round(c / seconds, 2) for c in cpu]}; "
                      f"{load_average()}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    base = rows[0]
    print(f"\n{args.events:,} events over {args.topics} topic-partitions, "
          f"{os.cpu_count()} cores; baseline: {base[0]} run(s)")
    print(f"{'runs':>5}{'seconds':>9}{'events/s':>10}{'speed-up':>10}  CPU share per run")
    for n, seconds, events, shares in rows:
        print(f"{n:>5}{seconds:>9.2f}{rate(events, seconds):>10,.0f}"
              f"{base[1] / seconds:>10.2f}  {' '.join(f'{s:.2f}' for s in shares)} "
              f"(sum {sum(shares):.2f})")
    print(f"at the end: {load_average()}; max RSS of a run "
          f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
