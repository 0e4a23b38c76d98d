"""The README's main job, end to end on the embedded local stack: `make demo`.

1. Starts a clean local stack: Kafka (KRaft), MariaDB with a ROW binlog, Debezium's
   MariaDB connector in Kafka Connect, and the Spark Connect server that replica builds
   and dbt share when `spark.remote` names one on this machine (the demo's state under
   `var/` is reset first, so every run tells the same story; the Dagster instance keeps
   its run history).
2. Creates the shop schema (customers, products, orders sharded into shop_1 / shop_2)
   and runs the demo workload: inserts, updates, deletes, a primary-key change, an added
   column and a truncate. Debezium publishes the binlog into Kafka.
3. Runs the pipeline through Dagster as a user would from the UI: the discovery sensor
   adds the topic-partitions, one bounded consumer run over them writes the
   changelog, Spark applies it to the replicas, dbt builds its models and tests.
   The example handler (`binlog_assets.examples.customer_cache`, named by binlake.yaml)
   keeps a Redis cache of `shop.customers` in step during the consumer run.
4. Prints, per table, source rows, replica rows and whether the content matches; the
   same for the Redis cache.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import dagster as dg
from confluent_kafka import Consumer, TopicPartition

from binlog_assets.config import PipelineConfig, load_config
from binlog_assets.consume.checkpoint import retry_retriable
from binlog_assets.dev import shop, stack
from binlog_assets.dev.connect import DebeziumFence
from binlog_assets.dev.redis import REDIS_URL_ENV
from binlog_assets.environment import kafka_client_config, var_dir
from binlog_assets.examples.customer_cache import HANDLERS_SPEC
from binlog_assets.examples.customer_cache import customers as customers_cache


def reset_local_state(pipeline: PipelineConfig) -> None:
    """Stop the local stack and remove its data, the lakehouse and the instance's
    partitions, so a topic recreated with the same name never resumes at an old offset."""
    stack.down(pipeline)
    for name in ("kafka", "mariadb", "connect", "spark-connect", "dbt", "redis"):
        shutil.rmtree(var_dir() / name, ignore_errors=True)
    shutil.rmtree(pipeline.lakehouse.resolved_path(), ignore_errors=True)
    with dg.DagsterInstance.get() as instance:
        from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME

        for key in instance.get_dynamic_partitions(KAFKA_PARTITIONS_NAME):
            instance.delete_dynamic_partition(KAFKA_PARTITIONS_NAME, key)
        instance.wipe_assets([dg.AssetKey("changelog")])


def wait_for_debezium(kafka_conf: dict, topics: list[str], settle: float = 4.0,
                      timeout: float = 180.0, fence: DebeziumFence | None = None
                      ) -> dict[str, int]:
    """End offsets of `topics` once Debezium has published what the source committed:
    past the `fence` (every change committed before the call), or, without one, once
    every topic exists and the end offsets stop moving for `settle` s."""
    consumer = Consumer({**kafka_conf, "group.id": "binlake-demo-wait"})
    try:
        deadline = time.monotonic() + timeout
        if fence is not None:
            fence.wait(timeout)
        last: dict[str, int] = {}
        stable_since = time.monotonic()
        while time.monotonic() < deadline:
            meta = consumer.list_topics(timeout=10).topics
            ends = {}
            for t in topics:
                if t in meta:
                    for p in meta[t].partitions:
                        # A new topic's leader may still be moving: retry that.
                        ends[f"{t}:{p}"] = retry_retriable(
                            lambda t=t, p=p: consumer.get_watermark_offsets(
                                TopicPartition(t, p), timeout=10, cached=False)[1],
                            f"end offset of {t}[{p}]")
            every_topic = len({k.rsplit(":", 1)[0] for k in ends}) == len(topics)
            if fence is not None and every_topic:
                return ends
            if ends != last:
                last, stable_since = ends, time.monotonic()
            elif every_topic and time.monotonic() - stable_since >= settle:
                return ends
            time.sleep(0.5)
        raise TimeoutError(f"Debezium did not publish every topic in {timeout}s: {last}")
    finally:
        consumer.close()


def dagster_job(job: str, partitions: tuple[str, str] | None = None,
               module: str = "binlog_assets.definitions") -> None:
    """Run one of the jobs users launch (`jobs/`) from the code location `module` against
    the local instance, in this process: the run `dagster job execute -m <module> -j <job>`
    makes, without a new process that imports Dagster and loads the code location again
    for each job (3-10 s each). A partitioned job runs over the range `partitions`."""
    import importlib

    from binlog_assets.orchestration.shared import RANGE_END_TAG, RANGE_START_TAG

    tags = {RANGE_START_TAG: partitions[0], RANGE_END_TAG: partitions[1]} if partitions else {}
    print(f"run {job} (as `dagster job execute -m {module} -j {job}"
          + (f" --tags '{json.dumps(tags)}'" if tags else "") + "`)", flush=True)
    definition = importlib.import_module(module).defs.resolve_job_def(job)
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    with dg.DagsterInstance.get() as instance:
        result = definition.execute_in_process(instance=instance, tags=tags, run_config=quiet,
                                               raise_on_error=False)
    if not result.success:
        failure = next((e for e in result.all_events if e.is_failure), None)
        raise SystemExit(f"dagster run {result.run_id} failed: {job} {partitions or ''}: "
                         f"{failure.message if failure else ''}")


def discover_partitions() -> list[str]:
    """One tick of the discovery sensor against the real instance; every partition, in
    the instance's order (the order partition ranges follow)."""
    from binlog_assets.definitions import defs
    from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME
    from binlog_assets.orchestration.resources import BinlakeResource
    from binlog_assets.orchestration.sensors import kafka_partition_discovery_sensor

    del defs  # importing validates the code location before anything runs
    with dg.DagsterInstance.get() as instance:
        ctx = dg.build_sensor_context(instance=instance, resources={"binlake": BinlakeResource()})
        result = kafka_partition_discovery_sensor(ctx)
        if isinstance(result, dg.SensorResult):
            for req in result.dynamic_partitions_requests:
                instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, list(req.partition_keys))
        return list(instance.get_dynamic_partitions(KAFKA_PARTITIONS_NAME))


def main() -> int:
    began = time.monotonic()
    pipeline = load_config()
    if pipeline.bootstrap_servers:
        print("the demo runs on the embedded local stack; unset kafka.bootstrap.servers")
        return 2
    reset_local_state(pipeline)
    print(stack.source_up(pipeline), flush=True)
    print(stack.up(pipeline), flush=True)  # the broker again (reused), Spark Connect, Redis
    os.environ[REDIS_URL_ENV] = stack.redis_url(pipeline)  # read by the handler example
    conn = stack.local_mariadb().connect()
    shop.create_schema(conn)
    statements = shop.demo_workload(conn)
    print(f"ran {statements} statements against MariaDB", flush=True)
    topics = [t for s in pipeline.sources for t in s.topics]
    ends = wait_for_debezium(kafka_client_config(pipeline), topics, fence=DebeziumFence(
        stack.local_connect(), stack.local_mariadb()))
    print(f"Debezium published: {json.dumps(ends)}", flush=True)

    pipeline_began = time.monotonic()
    keys = discover_partitions()
    # One consumer run for every topic-partition, as the lag sensor batches them.
    dagster_job("consume_changelog_job", (keys[0], keys[-1]))
    consumed = time.monotonic()
    dagster_job("build_replicas_job")
    replicated = time.monotonic()
    dagster_job("dbt_build_job", module="binlog_assets.dbt_definitions")
    elapsed = time.monotonic() - pipeline_began
    print(f"pipeline: {elapsed:.1f}s (consume {consumed - pipeline_began:.1f}s, "
          f"replicas {replicated - consumed:.1f}s, dbt {time.monotonic() - replicated:.1f}s)",
          flush=True)

    from binlog_assets.lakehouse.spark import get_spark

    spark = get_spark(pipeline)
    results = shop.compare(conn, spark, pipeline.lakehouse.database)
    print(f"\n{'table':<12}{'source rows':>12}{'replica rows':>14}  content")
    for r in results:
        print(f"{r.replica:<12}{r.source_rows:>12}{r.replica_rows:>14}  "
              f"{'matches' if r.matches else f'DIFFERS ({r.mismatched} rows)'}")
    checked = [*results]
    if any(s.handlers == HANDLERS_SPEC for s in pipeline.sources):
        cache = shop.compare_cache(conn, customers_cache.rows_at(os.environ[REDIS_URL_ENV]))
        checked.append(cache)
        print(f"{'cache':<12}{cache.source_rows:>12}{cache.replica_rows:>14}  "
              f"{'matches' if cache.matches else f'DIFFERS ({cache.mismatched} rows)'}"
              "  (Redis, kept by the customer_cache handler)")
    mart = f"`{pipeline.lakehouse.database}_marts`.`customer_revenue`"
    print(f"\ndbt mart {mart}: {spark.table(mart).count()} rows")
    print(f"lakehouse: {pipeline.lakehouse.resolved_path()} ({time.monotonic() - began:.0f}s)")
    return 0 if all(r.matches for r in checked) else 1


if __name__ == "__main__":
    sys.exit(main())
