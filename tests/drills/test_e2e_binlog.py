"""End to end from a real binlog: a seeded random DML workload in MariaDB, Debezium into
Kafka, one bounded consumer run per topic-partition writing the changelog (the
changelog asset's own code, `consume_partition`), Spark building the replicas; then
each replica's live rows must equal its source table, row for row, and the changelog
must hold every decoded event of the topics exactly once.

The runs are in-process on the session's Spark (the Dagster daemon path is
tests/orchestration/test_pipeline_e2e.py). The catch-up throughput, from the first
consumer run to the last replica built, is printed and recorded in the drill report.
"""

from __future__ import annotations

import time

from changelog_reads import changelog_frame
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

from binlog_assets.config import PipelineConfig
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.dev import drills, shop
from binlog_assets.dev.connect import DebeziumFence, KafkaConnect
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.rounds.round import consume_partition

SEED = 20261121
STATEMENTS = 400


def test_random_binlog_workload_replicas_equal_source(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, debezium_fence: DebeziumFence,
    pipeline_config: PipelineConfig,
    spark,
) -> None:
    pipeline = shop_config(pipeline_config, "e2e_binlog")
    kafka_conf = dict(pipeline.kafka)
    group = pipeline.kafka["group.id"]
    conn = mariadb.connect()
    statements = workload(conn, SEED, STATEMENTS)
    ends = wait_published(kafka_conf, debezium_fence)

    began = time.monotonic()
    summaries = [consume_partition(pipeline, kafka_conf, key, ChangelogRunConfig(),
                                   HandlerRegistry(), group=group)[0] for key in KEYS]
    consumed = time.monotonic()
    builder = ReplicaBuilder(spark, pipeline)
    results = [builder.apply(name) for name in REPLICAS]
    built = time.monotonic()

    events = sum(s.events for s in summaries)
    records = sum(s.records for s in summaries)
    seconds = built - began
    comparisons = shop.compare(conn, spark, pipeline.lakehouse.database)
    got = changelog_coordinates(changelog_frame(spark, pipeline))
    diff = coordinate_diff(kafka_model(kafka_conf, ends), got)
    figures = {
        "seed": SEED, "statements": statements, "kafka_records": records,
        "debezium_events": events, "per_op": _per_op(summaries),
        "replica_rows_written": sum(r.written for r in results),
        "rows_compared": sum(c.source_rows + c.replica_rows for c in comparisons),
        "mismatches": sum(c.mismatched + abs(c.source_rows - c.replica_rows)
                          for c in comparisons),
        "per_table": {c.replica: [c.source_rows, c.replica_rows, c.mismatched]
                      for c in comparisons},
        "changelog_missing": diff["missing"], "changelog_duplicates": diff["duplicates"],
        "changelog_unexpected": diff["unexpected"],
        "consume_seconds": round(consumed - began, 1),
        "replica_seconds": round(built - consumed, 1),
        "catch_up_events_per_s": round(events / seconds, 1),
    }
    drills.record("e2e_random_workload", figures)
    print(f"\ncatch-up: {events} Debezium events ({records} records) -> replicas in "
          f"{seconds:.1f}s = {events / seconds:.1f} events/s "
          f"(consume {consumed - began:.1f}s, replicas {built - consumed:.1f}s); "
          + "; ".join(f"{c.replica} {c.source_rows}/{c.replica_rows}" for c in comparisons))

    assert all(s.committed_offset == ends[k] for s, k in zip(summaries, KEYS, strict=True)), \
        (ends, [s.committed_offset for s in summaries])
    assert diff == {"missing": 0, "unexpected": 0, "duplicates": 0}, diff
    per_op = figures["per_op"]
    assert per_op.get("c", 0) and per_op.get("u", 0) and per_op.get("d", 0) and \
        per_op.get("t", 0) and per_op.get("ddl", 0), per_op
    for c in comparisons:
        assert c.source_rows > 0 and c.matches, c


def _per_op(summaries) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in summaries:
        for op, n in s.per_op().items():
            out[op] = out.get(op, 0) + n
    return out
