"""The anchor of E3: the Spark job a Spark engineer would write instead of binlake.

It serves `bench_catchup.py` from a process of its own (so its JVM start counts as
binlake's does): the parent starts it with the product's Spark settings (`spark_conf`:
master, driver memory, Delta, the class archive and JIT options) plus Spark's Kafka
source (`.cache/jars/spark-kafka`, `setup/maven/spark-kafka/pom.xml`), then sends it
one JSON command a line on stdin and reads one JSON answer a line from the process's
original stdout (everything else the process prints goes to stderr).

Each phase is one batch job: `spark.read.format("kafka")` of every topic over the given
offsets, `from_json` of the schema-less Debezium envelopes (`before`, `after`, `op`,
`source.file/pos/row`), the last event per key by Kafka offset (`max_by`), cached; then
one write per table, `parallel` tables at a time (a thread pool, as binlake's
`spark.parallel_replicas`): `create` writes each table's live rows as a new Delta table
(a CTAS by path: deletes dropped), `merge` MERGEs the last change per key into it
(update when matched and not a delete, delete when matched and a delete, insert when
not matched and not a delete). No changelog, no position guard, no exactly-once.

    {"cmd": "phase", "mode": "create" | "merge", "bootstrap": ..., "topics": [...],
     "paths": [...], "starting": "earliest" | {offsets}, "ending": "latest" | {offsets},
     "parallel": 2}
    {"cmd": "stop"}
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

COLUMNS = ("id", "customer_id", "status", "amount", "qty", "updated_at")
# The envelope as the MySQL connector writes it without schemas (bench_catchup's rows).
ROW = ("id: BIGINT, customer_id: BIGINT, status: STRING, amount: STRING, qty: BIGINT, "
       "updated_at: BIGINT")
ENVELOPE = (f"before STRUCT<{ROW}>, after STRUCT<{ROW}>, "
            "source STRUCT<file: STRING, pos: BIGINT, row: INT>, op STRING, ts_ms BIGINT")


def _offsets(value: str | dict) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class Anchor:
    """One Spark session, started at the first phase; a phase per command."""

    def __init__(self, conf: dict[str, str]) -> None:
        self.conf = conf
        self.spark = None

    def start(self) -> float:
        from pyspark.sql import SparkSession

        began = time.perf_counter()
        builder = SparkSession.builder
        for k, v in self.conf.items():
            builder = builder.config(k, v)
        self.spark = builder.getOrCreate()
        self.spark.sparkContext.setLogLevel("WARN")
        return time.perf_counter() - began

    def phase(self, cmd: dict) -> dict:
        from pyspark.sql import functions as F

        spark_start = self.start() if self.spark is None else 0.0
        spark = self.spark
        began = time.perf_counter()
        raw = (spark.read.format("kafka")
               .option("kafka.bootstrap.servers", cmd["bootstrap"])
               .option("subscribe", ",".join(cmd["topics"]))
               .option("startingOffsets", _offsets(cmd["starting"]))
               .option("endingOffsets", _offsets(cmd["ending"]))
               .load())
        events = raw.select("topic", "offset",
                            F.from_json(F.col("value").cast("string"), ENVELOPE).alias("e"))
        last = (events
                .select("topic", F.coalesce("e.after.id", "e.before.id").alias("id"),
                        "offset", "e.op", "e.after")
                .groupBy("topic", "id")
                .agg(F.max_by(F.struct("op", "after"), "offset").alias("last"))
                .select("topic", "id", "last.op", "last.after")
                .persist())
        keys = last.count()
        read = time.perf_counter() - began

        create = cmd["mode"] == "create"

        def write(i: int) -> float:
            topic, path = cmd["topics"][i], cmd["paths"][i]
            rows = last.where(F.col("topic") == topic)
            a = time.perf_counter()
            if create:
                (rows.where(F.col("op") != "d").select("after.*")
                 .write.format("delta").save(path))
            else:
                merge(spark, path, rows.select("id", "op", "after"))
            return time.perf_counter() - a

        began = time.perf_counter()
        with ThreadPoolExecutor(cmd["parallel"], thread_name_prefix="anchor") as pool:
            writes = list(pool.map(write, range(len(cmd["topics"]))))
        wall = time.perf_counter() - began
        last.unpersist()
        return {"spark_start": spark_start, "read": read, "keys": keys,
                "write_wall": wall, "writes": writes,
                "write_median": statistics.median(writes)}


def merge(spark, path: str, changes) -> None:  # SparkSession, DataFrame
    """MERGE the last change per key into the Delta table at `path`."""
    from delta.tables import DeltaTable

    values = {c: f"s.after.{c}" for c in COLUMNS}
    (DeltaTable.forPath(spark, path).alias("t")
     .merge(changes.alias("s"), "t.id = s.id")
     .whenMatchedDelete(condition="s.op = 'd'")
     .whenMatchedUpdate(condition="s.op != 'd'", set=values)
     .whenNotMatchedInsert(condition="s.op != 'd'", values=values)
     .execute())


def serve() -> None:
    """Answer the parent's commands, one JSON line each, until `stop` or end of input."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the JVM's and anyone else's prints: to stderr
    anchor = Anchor(json.loads(sys.stdin.readline()))
    answers.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "stop":
            break
        try:
            answer = anchor.phase(cmd)
        except Exception as exc:  # the parent raises it, named
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(answer) + "\n")
    if anchor.spark is not None:
        anchor.spark.stop()


if __name__ == "__main__":
    serve()
