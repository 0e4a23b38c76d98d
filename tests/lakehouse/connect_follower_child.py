"""Child process of test_spark_connect: a follower run through a Spark Connect server
that the parent restarts in the middle of it.

Usage: connect_follower_child.py <config.yaml>. The child writes a commit and waits for
its materialization, prints `stop` and waits for a line on stdin (the parent stops the
server), writes a second commit while the server is down (a column added: its apply
needs Spark), prints `start` and waits for a
line (the parent starts it again), waits for the second commit's materialization, then
asks for the spark pool (the follower hands it over and ends). It prints the run's
outcome as a literal.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import dagster as dg
from lake_events import Partition, Source, follower_beside, row

from binlog_assets.config import load_config
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.lakehouse.spark import get_spark
from binlog_assets.orchestration.replica_reports import replica_key
from binlog_assets.orchestration.shared import SPARK_POOL

DEADLINE_SECONDS = 300.0
OUTAGE_SECONDS = 5.0


def main() -> None:
    path = sys.argv[1]
    pipeline = load_config(path)
    (table,) = pipeline.sources[0].tables
    src = Source(table.source)
    part = Partition(ChangelogWriter(pipeline))
    part.write(part.records([[src.insert(row(1))]]))
    reached: list[int] = []

    def applied(instance: dg.DagsterInstance) -> int:
        return len(instance.fetch_materializations(replica_key(table.replica),
                                                   limit=10).records)

    def writer(instance: dg.DagsterInstance) -> None:
        deadline = time.monotonic() + DEADLINE_SECONDS
        for wanted in (1, 2):
            while applied(instance) < wanted:
                if time.monotonic() > deadline:
                    instance.event_log_storage.claim_concurrency_slot(SPARK_POOL, "x", "y")
                    return
                time.sleep(0.2)
            reached.append(wanted)
            if wanted == 1:
                print("stop", flush=True)  # the parent stops the server
                sys.stdin.readline()
                # A column added: its apply needs Spark (ALTER TABLE, the view anew).
                part.write(part.records([[src.ddl({**src.types, "extra": "int"}),
                                          src.insert({**row(2), "extra": 7})]]))
                time.sleep(OUTAGE_SECONDS)  # the follower's apply meets the server down
                print("start", flush=True)  # the parent starts it again
                sys.stdin.readline()
        instance.event_log_storage.claim_concurrency_slot(SPARK_POOL, "rebuild", "replicas")

    with follower_beside(writer, path, 600, raise_on_error=False) as (instance, result):
        warnings = [e.user_message for e in instance.all_logs(result.run_id)
                    if e.level == logging.WARNING]
        errors = [e.user_message for e in instance.all_logs(result.run_id)
                  if e.level >= logging.ERROR]
    spark = get_spark(pipeline)
    ids = sorted(r["id"] for r in spark.table(
        f"{pipeline.lakehouse.database}.{table.replica}_current").collect())
    print(repr({"success": result.success, "reached": reached, "ids": ids,
                "warnings": warnings, "errors": errors}), flush=True)


if __name__ == "__main__":
    main()
