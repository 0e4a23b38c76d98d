"""The whole Dagster data product on the real stack: events in, replica rows and dbt rows out.

A Dagster daemon runs against a fresh instance (the repository's dagster.yaml), a CLI
backfill over 4 topic-partitions launches 4 bounded consumer runs, and the automation
sensor then builds the replicas on its own, and `dbt_follow_sensor` the dbt models.
Every Spark step runs in its own process, one at a time (the `spark` pool), so this test
reads the results by path, never through the catalog its subprocesses share.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from decimal import Decimal
from pathlib import Path

import dagster as dg
import orjson
import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from dagster import DagsterEventType

from binlog_assets.config import PipelineConfig
from binlog_assets.dev.kafka import create_topics
from binlog_assets.environment import REPO_ROOT
from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME, partition_key

BIN = Path(sys.executable).parent
DB = "binlake_e2e"
TABLES = {  # topic suffix -> source table
    "customers": "shop.customers",
    "products": "shop.products",
    "orders1": "shop_1.orders",
    "orders2": "shop_2.orders",
}


class Binlog:
    """Debezium envelopes (no schema block) with a growing binlog position."""

    def __init__(self) -> None:
        self.pos = 1000

    def event(self, table: str, op: str, before: dict | None, after: dict | None):
        self.pos += 100
        db, tbl = table.split(".")
        row = after or before
        value = {"before": before, "after": after, "op": op, "ts_ms": self.pos,
                 "source": {"db": db, "table": tbl, "file": "mysql-bin.000007",
                            "pos": self.pos, "row": 0, "snapshot": "false",
                            "ts_ms": self.pos}}
        key = orjson.dumps({"id": row["id"]}) if row else None
        return key, orjson.dumps(value)


def workload(topics: dict[str, str]) -> dict[str, list[tuple[bytes | None, bytes]]]:
    b = Binlog()
    out: dict[str, list] = {t: [] for t in topics.values()}

    def emit(name: str, op: str, before=None, after=None) -> None:
        out[topics[name]].append(b.event(TABLES[name], op, before, after))

    customers = {i: {"id": i, "name": n, "email": f"{n.lower()}@x.org"}
                 for i, n in enumerate(["Ada", "Grace", "Edsger", "Barbara", "Ken"], 1)}
    for c in customers.values():
        emit("customers", "c", after=c)
    emit("customers", "u", customers[2], {**customers[2], "email": "grace@navy.mil"})
    emit("customers", "d", before=customers[5])
    products = {i: {"id": i, "name": f"p{i}", "price": p} for i, p in
                enumerate([10.0, 20.5, 3.25, 7.0], 1)}
    for p in products.values():
        emit("products", "c", after=p)
    emit("products", "d", before=products[3])  # a primary-key change: 3 -> 40
    emit("products", "c", after={**products[3], "id": 40})
    for shard, n in (("orders1", 6), ("orders2", 5)):
        for i in range(1, n + 1):
            emit(shard, "c", after={"id": i, "customer_id": 1 + i % 4, "product_id": 1 + i % 2,
                                    "quantity": i, "status": "new"})
    emit("orders1", "d", before={"id": 3, "customer_id": 4, "product_id": 2, "quantity": 3,
                                 "status": "new"})
    out[topics["orders2"]].append((None, orjson.dumps({
        "before": None, "after": None, "op": "t", "ts_ms": 1,
        "source": {"db": "shop_2", "table": "orders", "file": "mysql-bin.000007",
                   "pos": b.pos + 50, "row": 0, "snapshot": "false"}})))
    b.pos += 100
    emit("orders2", "c", after={"id": 10, "customer_id": 2, "product_id": 40, "quantity": 2,
                                "status": "new"})
    return out


@pytest.fixture
def e2e_env(pipeline_config: PipelineConfig, tmp_path: Path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "setup" / "dagster.yaml", home / "dagster.yaml")
    run = uuid.uuid4().hex[:6]
    topics = {name: f"e2e-{run}-{name}" for name in TABLES}
    pipeline = pipeline_config.model_dump(mode="json", exclude_none=True)
    pipeline["kafka"]["group.id"] = f"binlake-e2e-{run}"
    pipeline["lakehouse"] = {"path": str(tmp_path / "lake"), "database": DB}
    # The test launches the consumer runs itself: the lag sensor must not.
    pipeline["dagster"] = {"lag_threshold": 10**9, "max_staleness_seconds": 10**9}
    pipeline["sources"] = [{
        "name": "shop", "format": "debezium", "topics": sorted(topics.values()),
        "tables": [{"source": "shop.customers", "replica": "customers"},
                   {"source": "shop.products", "replica": "products"},
                   {"source": r"shop_\d+\.orders", "replica": "orders"}],
    }]
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline))
    env = {**os.environ, "DAGSTER_HOME": str(home), "BINLAKE_CONFIG": str(path),
           "BINLAKE_VAR_DIR": str(tmp_path / "var")}
    return topics, pipeline, env, home, tmp_path / "lake"


def _wait(what: str, predicate, timeout: float, daemon: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if daemon.poll() is not None:
            pytest.fail(f"dagster-daemon exited early:\n{log.read_text()[-3000:]}")
        time.sleep(2)
    pytest.fail(f"timed out waiting for {what}; daemon log:\n{log.read_text()[-3000:]}")


def _failure(instance: dg.DagsterInstance, run_id: str) -> str:
    """The error messages of a failed run's step and run failure events."""
    out = []
    for record in instance.all_logs(run_id):
        event = record.dagster_event
        error = getattr(getattr(event, "event_specific_data", None), "error", None)
        if event is not None and event.is_failure and error is not None:
            out.append(f"{record.step_key}: {error.to_string()[-3000:]}")
        elif event is not None and event.event_type_value == "PIPELINE_FAILURE":
            out.append(f"run: {record.user_message}")
    return "\n".join(out)


@pytest.mark.long
@pytest.mark.timeout(2400)  # 4 Spark runs, then replicas and dbt, one JVM at a time
def test_events_to_replicas_to_dbt_through_backfill_and_automation(e2e_env, spark) -> None:
    topics, pipeline, env, home, lake = e2e_env
    bootstrap = pipeline["kafka"]["bootstrap.servers"]
    create_topics(bootstrap, list(topics.values()))
    producer = Producer({"bootstrap.servers": bootstrap})
    ends = {}
    for topic, records in workload(topics).items():
        for key, value in records:
            producer.produce(topic, key=key, value=value)
        ends[partition_key(topic, 0)] = len(records)
    assert producer.flush(30) == 0

    keys = sorted(ends)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, keys)

    log = home / "daemon.log"
    with open(log, "w") as out:
        daemon = subprocess.Popen([str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"],
                                  cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        subprocess.run(
            [str(BIN / "dagster"), "job", "backfill", "-w", "workspace.yaml",
             "--location", "binlake", "-j", "consume_changelog_job",
             "--partitions", ",".join(keys), "--noprompt"],
            cwd=REPO_ROOT, env=env, check=True, capture_output=True, timeout=300)

        with dg.DagsterInstance.from_config(str(home)) as instance:
            def backfill_runs():
                runs = [r for r in instance.get_runs()
                        if r.job_name == "consume_changelog_job" and "dagster/backfill" in r.tags]
                failed = [r for r in runs if r.status == dg.DagsterRunStatus.FAILURE]
                if failed:
                    pytest.fail(f"consumer run failed: {failed[0].run_id}\n"
                                f"{_failure(instance, failed[0].run_id)}")
                done = [r for r in runs if r.status == dg.DagsterRunStatus.SUCCESS]
                return runs if len(done) == 4 else None

            runs = _wait("4 backfill runs", backfill_runs, 600, daemon, log)
            assert sorted(r.tags["dagster/partition"] for r in runs) == keys
            assert len({r.tags["dagster/backfill"] for r in runs}) == 1
            # The queued run coordinator (max_concurrent_runs: 4) launched them side by
            # side: the last launch came before the first run ended. Launches, not run
            # starts: a loaded host may take longer to start a run's process than to run it.
            records = instance.get_run_records(
                dg.RunsFilter(run_ids=[r.run_id for r in runs]))
            launched = [instance.all_logs(rec.dagster_run.run_id,
                                          of_type=DagsterEventType.RUN_STARTING)[0].timestamp
                        for rec in records]
            ended = [rec.end_time for rec in records]
            assert max(launched) < min(ended), (launched, ended)

            # Offsets are in the metadata of each partition's materialization.
            for key in keys:
                (record,) = instance.fetch_materializations(
                    dg.AssetRecordsFilter(asset_key=dg.AssetKey("changelog"),
                                          asset_partitions=[key]), limit=1).records
                md = record.asset_materialization.metadata
                assert md["committed_offset"].value == ends[key]
                assert md["end_offset_at_start"].value == ends[key]
                assert md["records"].value == ends[key]
                assert md["lag_at_end"].value == 0

            # The replicas (automation), then the dbt models (dbt_follow_sensor, within
            # its 5-minute interval), follow on their own.
            followers = [dg.AssetKey(["replica", r]) for r in ("customers", "orders", "products")]
            followers += [dg.AssetKey(m) for m in
                          ("stg_customers", "stg_products", "stg_orders", "customer_revenue")]

            def all_followed():
                return all(instance.get_latest_materialization_event(k) is not None
                           for k in followers)

            _wait("replicas and dbt models", all_followed, 600, daemon, log)

            def all_runs_finished():
                runs = instance.get_runs()
                return runs if all(r.is_finished for r in runs) else None

            # Every run the daemon launched (the backfill's and automation's) ends well.
            runs = _wait("the runs to finish", all_runs_finished, 300, daemon, log)
            failed = [r for r in runs if r.status != dg.DagsterRunStatus.SUCCESS]
            assert not failed, [(r.job_name, r.status, _failure(instance, r.run_id))
                                for r in failed]
            md = instance.get_latest_materialization_event(
                dg.AssetKey(["replica", "orders"])).asset_materialization.metadata
            assert md["rows"].value == 6  # shop_1: 1,2,4,5,6; shop_2: 10 after the truncate
            check_keys = [dg.AssetCheckKey(dg.AssetKey("stg_orders"),
                                           "unique_stg_orders_order_key")]
            check_keys += [dg.AssetCheckKey(k, "row_count_matches_changelog")
                           for k in followers if k.path[0] == "replica"]
            checks = instance.event_log_storage.get_latest_asset_check_execution_by_key(
                check_keys)
            assert sorted(checks) == sorted(check_keys)
            assert all(c.status.value == "SUCCEEDED" for c in checks.values()), checks
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(60)

    # Kafka agrees with the metadata.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": pipeline["kafka"]["group.id"]})
    committed = c.committed([TopicPartition(t, 0) for t in topics.values()], timeout=30)
    c.close()
    assert {partition_key(tp.topic, 0): tp.offset for tp in committed} == ends

    def live(name: str) -> list[dict]:
        df = spark.read.format("delta").load(str(lake / "warehouse" / f"{DB}.db" / name))
        return [r.asDict() for r in df.where("_op NOT IN ('d', 't')").collect()]

    customers = {r["id"]: r["email"] for r in live("customers")}
    assert customers == {1: "ada@x.org", 2: "grace@navy.mil", 3: "edsger@x.org",
                         4: "barbara@x.org"}
    assert sorted(r["id"] for r in live("products")) == [1, 2, 4, 40]
    assert sorted((r["_source_db"], r["id"]) for r in live("orders")) == [
        ("shop_1", 1), ("shop_1", 2), ("shop_1", 4), ("shop_1", 5), ("shop_1", 6),
        ("shop_2", 10)]

    mart = spark.read.format("delta").load(
        str(lake / "warehouse" / f"{DB}_marts.db" / "customer_revenue"))
    revenue = {r.customer_id: (r.orders, Decimal(str(r.revenue))) for r in mart.collect()}
    # shop_1 orders 1,2,4,5,6 and shop_2 order 10, priced by product at the end state.
    price = {1: Decimal("10.00"), 2: Decimal("20.50"), 4: Decimal("7.00"),
             40: Decimal("3.25")}
    expected: dict[int, list] = {c: [0, Decimal("0")] for c in customers}
    for _order, cust, prod, qty in [(1, 2, 2, 1), (2, 3, 1, 2), (4, 1, 1, 4), (5, 2, 2, 5),
                                 (6, 3, 1, 6), (10, 2, 40, 2)]:
        expected[cust][0] += 1
        expected[cust][1] += qty * price[prod]
    assert revenue == {c: (n, v) for c, (n, v) in expected.items()}
    print(json.dumps({"partitions": keys, "runs": 4}))
