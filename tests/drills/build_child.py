"""The replica build of the cluster and S3 end-to-end tests, in a process of its own (one
SparkContext per process: the test session's own Spark is `local[2]` on a local lake).

`python build_child.py CONFIG_PATH MARIADB_DATA_DIR` builds every shop replica with
`ReplicaBuilder` on the Spark and lakehouse the config names (`spark.master:
spark://...`, `lakehouse.path: s3a://...`), compares each with its MariaDB source, and
prints one `BUILD-RESULT <json>` line: per replica, (source rows, replica rows,
mismatches), the executors that ran, and the seconds taken.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> None:
    from binlog_assets.config import load_config
    from binlog_assets.dev import shop
    from binlog_assets.dev.mariadb import MariaDBServer
    from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
    from binlog_assets.lakehouse.spark import get_spark

    pipeline = load_config(sys.argv[1])
    began = time.monotonic()
    spark = get_spark(pipeline)
    started = time.monotonic()
    builder = ReplicaBuilder(spark, pipeline)
    results = {name: builder.apply(name) for name in sorted(shop.REPLICAS)}
    built = time.monotonic()
    conn = MariaDBServer(Path(sys.argv[2])).connect()
    comparisons = shop.compare(conn, spark, pipeline.lakehouse.database)
    executors = [e.host + ":" + str(e.port)
                 for e in spark.sparkContext.statusTracker().getExecutorInfos()]
    print("BUILD-RESULT " + json.dumps({
        "master": spark.sparkContext.master,
        # The driver is listed too: executors are the others.
        "executors": len(executors) - 1,
        "written": {n: r.written for n, r in results.items()},
        "compared": {c.replica: [c.source_rows, c.replica_rows, c.mismatched]
                     for c in comparisons},
        "replica_location": spark.sql(
            f"DESCRIBE DETAIL `{pipeline.lakehouse.database}`.`{sorted(shop.REPLICAS)[0]}`"
        ).collect()[0]["location"],
        "session_seconds": round(started - began, 1),
        "build_seconds": round(built - started, 1),
    }), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
