"""E1: freshness as a user meets it: a change committed in MariaDB -> visible in its replica.

Starts its own stack in a temporary directory (the Kafka broker, MariaDB with a ROW binlog,
Debezium's MariaDB connector in Kafka Connect, and with `--spark connect`, the default, the
Spark Connect server that replica builds and dbt share), a Dagster instance with the project's
`setup/dagster.yaml`, and the Dagster daemon over `workspace.yaml` (sensors, automation and
the run queue, as `dagster dev` runs them): nothing drives the pipeline but the daemon.
Then it commits `--changes` single-row changes to `shop.customers` (an insert, an update
and a delete of a fresh id, in turn), one after the other, and for each measures:

- to the changelog: the first changelog version holding the change (delta-rs's change
  feed, `_commit_version`), seen by polling every 0.2 s;
- to the replica: the first `replica/customers` materialization whose applied changelog
  version covers it; its event time is when the apply had committed (`customers_current`
  reads the table's latest version), so this is an upper bound.

It prints every change and the p50/p95 of both against the targets (p50 <= 5 s,
p95 <= 30 s) as ratios. The first change (the replica's first build) is reported apart.

E8 (`--mart`): each change is also timed to the dbt mart `customer_revenue` (the dbt
location's `dbt_follow_sensor` builds it; `--dbt-follow-seconds` is
`dagster.dbt_follow_seconds`), read with delta-rs outside Spark: the customer's row there,
its name, or its absence. Its baseline is the physical limit in the same run: the mart
reads the replica, so it cannot be fresher; the ratio mart / replica is printed.

    .venv/bin/python bench/bench_freshness.py [--changes 20] [--pause 2] [--spark connect]
    .venv/bin/python bench/bench_freshness.py --mart --changes 6 --dbt-follow-seconds 0
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg
import yaml
from deltalake import DeltaTable

from binlog_assets.config import parse_config
from binlog_assets.dev import shop
from binlog_assets.dev.connect import DebeziumConnector, KafkaConnect
from binlog_assets.dev.kafka import KafkaBroker
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.dev.process import free_port
from binlog_assets.dev.spark_connect import SparkConnectServer
from binlog_assets.environment import REPO_ROOT
from binlog_assets.lakehouse.changelog import changelog_uri
from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME, partition_key

TARGET_P50, TARGET_P95 = 5.0, 30.0
TOPIC = "shop.shop.customers"
TOPICS = [TOPIC, "shop.shop.products", "shop.shop_1.orders", "shop.shop_2.orders"]
REPLICA_KEY = dg.AssetKey(["replica", "customers"])
CHANGELOG_KEY = dg.AssetKey(["changelog"])
POLL = 0.2
# Where a change's seconds go, in the order it meets them (see `Watcher.stages`).
STAGES = ("lag_tick", "consume_launch", "consume", "automation_tick", "replica_launch",
          "apply")
ALL_STAGES = (*STAGES, "follow_consume", "follow_apply")


def wait_for_topic(bootstrap: str, topic: str, timeout: float = 120.0) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while topic not in admin.list_topics(timeout=10).topics:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Debezium did not create {topic} in {timeout:.0f}s")
        time.sleep(0.5)


class Watcher:
    """Where a change has got to: the changelog (delta-rs) and the replica (Dagster)."""

    def __init__(self, changelog: str, instance: dg.DagsterInstance) -> None:
        self.changelog = changelog
        self.instance = instance
        self.seen_version = -1
        self.found: dict[tuple[str, str], int] = {}  # (key JSON, op) -> changelog version

    def changelog_version_of(self, key: str, op: str) -> int | None:
        if (key, op) in self.found:
            return self.found[(key, op)]
        if not DeltaTable.is_deltatable(self.changelog):
            return None
        table = DeltaTable(self.changelog)
        if table.version() > self.seen_version:
            for batch in table.load_cdf(starting_version=self.seen_version + 1,
                                        columns=["key", "op", "_commit_version"]):
                keys = batch.column("key").to_pylist()
                ops = batch.column("op").to_pylist()
                versions = batch.column("_commit_version").to_pylist()
                for k, o, v in zip(keys, ops, versions, strict=True):
                    self.found.setdefault((k, o), v)
            self.seen_version = table.version()
        return self.found.get((key, op))

    def replica_covering(self, version: int) -> dg.EventLogRecord | None:
        records = self.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=REPLICA_KEY), limit=20).records
        covering = [r for r in records
                    if (v := r.asset_materialization.metadata.get("applied_changelog_version"))
                    is not None and v.value >= version]
        return min(covering, key=lambda r: r.timestamp) if covering else None

    def stages(self, committed: float, version: int, replica: dg.EventLogRecord
               ) -> dict[str, float]:
        """Seconds of each stage: the lag sensor's tick (commit -> consume run created), its
        launch (created -> the run's process has loaded the code location), the consume (->
        the changelog materialized); then either the automation's tick (-> the replica run
        created), its launch and the apply (-> the replica materialized), or, when a
        follower run was already going, its poll and apply (`follow_apply`)."""
        changelog = next((
            r for r in self.instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=CHANGELOG_KEY), limit=50).records
            if (v := r.asset_materialization.metadata.get("changelog_version")) is not None
            and v.value == version), None)
        if changelog is None:  # older than the last 50 materializations
            return {}
        run = self.instance.get_run_record_by_id(changelog.run_id)
        follower = self.instance.get_run_record_by_id(replica.run_id)
        if run.create_timestamp.timestamp() < committed:  # a changelog follower run
            return {"follow_consume": round(changelog.timestamp - committed, 1),
                    "follow_apply": round(replica.timestamp - changelog.timestamp, 1)}
        points = [committed, run.create_timestamp.timestamp(),
                  run.start_time or changelog.timestamp, changelog.timestamp]
        if follower.create_timestamp.timestamp() < changelog.timestamp:
            stages = dict(zip(STAGES[:3], _steps(points), strict=True))
            return {**stages, "follow_apply": round(replica.timestamp - changelog.timestamp, 1)}
        points += [follower.create_timestamp.timestamp(),
                   follower.start_time or replica.timestamp, replica.timestamp]
        return dict(zip(STAGES, _steps(points), strict=True))


def _steps(points: list[float]) -> list[float]:
    return [round(b - a, 1) for a, b in zip(points, points[1:], strict=False)]


def measure(conn, watcher: Watcher, ident: int, sql: str, args: tuple, op: str,
            timeout: float) -> tuple[float, float, dict[str, float]]:
    """Commit one change; seconds until it is in the changelog, and in the replica, and
    the stages between (with `committed`, the commit's time)."""
    with conn.cursor() as cur:
        cur.execute(sql, args)
    committed = time.time()
    key = f'{{"id":{ident}}}'
    deadline = committed + timeout
    to_changelog = None
    while time.time() < deadline:
        version = watcher.changelog_version_of(key, op)
        if version is not None:
            if to_changelog is None:
                to_changelog = time.time() - committed
            replica = watcher.replica_covering(version)
            if replica is not None:
                return (to_changelog, max(replica.timestamp - committed, to_changelog),
                        {**watcher.stages(committed, version, replica),
                         "committed": committed})
        time.sleep(POLL)
    raise TimeoutError(f"change {op} id={ident} not in the replica after {timeout:.0f}s "
                       f"(changelog: {to_changelog})")


def mart_shows(work: Path, ident: int, op: str, name: str) -> bool:
    """Whether `customer_revenue`, read by delta-rs, shows the change of customer `ident`."""
    log = next(work.rglob("customer_revenue/_delta_log"), None)
    if log is None or not DeltaTable.is_deltatable(str(log.parent)):  # not created yet
        return False
    rows = DeltaTable(str(log.parent)).to_pyarrow_table(
        columns=["customer_id", "customer_name"]).to_pylist()
    names = {r["customer_id"]: r["customer_name"] for r in rows}
    return ident not in names if op == "d" else names.get(ident) == name


def wait_for_mart(work: Path, ident: int, op: str, name: str, committed: float,
                  timeout: float) -> float:
    deadline = committed + timeout
    while time.time() < deadline:
        if mart_shows(work, ident, op, name):
            return time.time() - committed
        time.sleep(POLL)
    raise TimeoutError(f"change {op} id={ident} not in customer_revenue after {timeout:.0f}s")


def stop_stack(daemon: subprocess.Popen | None, connect: KafkaConnect | None,
               spark: SparkConnectServer | None, mariadb: MariaDBServer,
               broker: KafkaBroker) -> None:
    """The daemon with the runs it launched (its own session), then the stack."""
    if daemon is not None:
        with_children = os.getpgid(daemon.pid)
        os.killpg(with_children, signal.SIGTERM)
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(with_children, signal.SIGKILL)
    if connect is not None:
        connect.stop()
    if spark is not None:
        spark.stop()
    mariadb.stop()
    broker.stop()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--pause", type=float, default=2.0,
                        help="seconds between one change's visibility and the next change")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--follow-seconds", type=float, default=600.0,
                        help="dagster.replica_follow_seconds: a follower run applies each "
                             "changelog version as it lands (binlake.yaml's setting); 0: "
                             "automation builds the replicas after each consumer run")
    parser.add_argument("--changelog-follow-seconds", type=float, default=600.0,
                        help="dagster.changelog_follow_seconds: a follower run consumes "
                             "each partition's records as they arrive (binlake.yaml's "
                             "setting); 0: the lag sensor launches a run per batch")
    parser.add_argument("--mart", action="store_true",
                        help="E8: time each change to the dbt mart customer_revenue too")
    parser.add_argument("--dbt-follow-seconds", type=float, default=300.0,
                        help="dagster.dbt_follow_seconds (the shipped default 300)")
    parser.add_argument("--spark", choices=["connect", "in-process"], default="connect",
                        help="replica builds and dbt on a warm Spark Connect server, or a "
                             "Spark started by each run")
    args = parser.parse_args()
    # A SIGTERM stops the stack and the daemon too (the `finally` below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="binlake-fresh-"))
    broker = KafkaBroker(work / "kafka")
    mariadb = MariaDBServer(work / "mariadb")
    connect: KafkaConnect | None = None
    spark: SparkConnectServer | None = None
    daemon: subprocess.Popen | None = None
    try:
        broker.start()
        mariadb.start()
        conn = mariadb.connect()
        # The demo's shop, so that the dbt models (which automation also runs) build.
        shop.create_schema(conn)
        with conn.cursor() as cur:  # a row in each table: Debezium creates every topic
            cur.execute("INSERT INTO shop.customers VALUES (1, 'first', 'f@example.com')")
            cur.execute("INSERT INTO shop.products VALUES (1, 'widget', 2.50, 0.3)")
            for n, s in enumerate(shop.SHARDS):
                cur.execute(f"INSERT INTO {s}.orders VALUES (1, 1, 1, {n + 1}, 'new', NULL)")
        connect = KafkaConnect(work / "connect", broker.bootstrap_servers,
                               DebeziumConnector.for_server(mariadb, topic_prefix="shop"))
        connect.start()
        for topic in TOPICS:
            wait_for_topic(broker.bootstrap_servers, topic)
        pipeline = {
            "kafka": {"bootstrap.servers": broker.bootstrap_servers, "group.id": "fresh",
                      "auto.offset.reset": "earliest", "isolation.level": "read_committed"},
            "lakehouse": {"path": str(work / "lakehouse"), "database": "fresh"},
            "dagster": {"replica_follow_seconds": args.follow_seconds,
                        "changelog_follow_seconds": args.changelog_follow_seconds,
                        "dbt_follow_seconds": args.dbt_follow_seconds},
            "sources": [{"name": "shop", "topics": TOPICS, "format": "debezium",
                         "tables": [{"source": "shop.customers", "replica": "customers"},
                                    {"source": "shop.products", "replica": "products"},
                                    {"source": r"shop_\d+\.orders", "replica": "orders"}]}],
        }
        if args.spark == "connect":
            pipeline["spark"] = {"remote": f"sc://127.0.0.1:{free_port()}"}
            spark = SparkConnectServer.for_config(parse_config(pipeline), work / "spark-connect")
            print(f"spark connect server ready in {spark.start():.1f}s", flush=True)
        config_path = work / "binlake.yaml"
        config_path.write_text(yaml.safe_dump(pipeline))
        home = work / "dagster"
        home.mkdir()
        shutil.copy(REPO_ROOT / "setup" / "dagster.yaml", home / "dagster.yaml")
        env = {**os.environ, "BINLAKE_CONFIG": str(config_path), "DAGSTER_HOME": str(home)}
        with dg.DagsterInstance.from_config(str(home)) as instance:
            instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME,
                                            [partition_key(t, 0) for t in TOPICS])
            with open(work / "daemon.log", "w") as log:
                daemon = subprocess.Popen(
                    [str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w",
                     str(REPO_ROOT / "workspace.yaml")],
                    cwd=REPO_ROOT, env=env, start_new_session=True, stdout=log,
                    stderr=subprocess.STDOUT)
            watcher = Watcher(changelog_uri(parse_config(pipeline)), instance)
            began = time.monotonic()
            first = measure(conn, watcher, 2, "INSERT INTO shop.customers VALUES (%s, %s, %s)",
                            (2, "second", "s@example.com"), "c", args.timeout)
            print(f"first change (the replica's first build), daemon up "
                  f"{time.monotonic() - began:.0f}s before: changelog {first[0]:.1f}s, "
                  f"replica {first[1]:.1f}s", flush=True)
            if args.mart:  # the mart's first build, reported apart too
                built = wait_for_mart(work, 2, "c", "second", first[2]["committed"],
                                      args.timeout)
                print(f"first change in the mart: {built:.1f}s", flush=True)
            to_changelog: list[float] = []
            to_replica: list[float] = []
            to_mart: list[float] = []
            stages: list[dict[str, float]] = []
            for i in range(args.changes):
                ident = 100 + i // 3
                kind = i % 3
                if kind == 0:
                    change = ("INSERT INTO shop.customers VALUES (%s, %s, %s)",
                              (ident, f"n{i}", f"{i}@example.com"), "c")
                elif kind == 1:
                    change = ("UPDATE shop.customers SET name = %s WHERE id = %s",
                              (f"n{i}", ident), "u")
                else:
                    change = ("DELETE FROM shop.customers WHERE id = %s", (ident,), "d")
                time.sleep(args.pause)
                c, r, st = measure(conn, watcher, ident, *change, args.timeout)
                committed = st.pop("committed")
                m = (wait_for_mart(work, ident, change[2], f"n{i}", committed, args.timeout)
                     if args.mart else None)
                to_changelog.append(c)
                to_replica.append(r)
                if m is not None:
                    to_mart.append(m)
                stages.append(st)
                print(f"change {i + 1:2d} ({change[2]} id={ident}): changelog {c:5.1f}s, "
                      f"replica {r:5.1f}s" + (f", mart {m:5.1f}s" if m is not None else "")
                      + f"; load {os.getloadavg()[0]:.2f}; "
                      + ", ".join(f"{k} {v}" for k, v in st.items()), flush=True)
    finally:
        stop_stack(daemon, connect, spark, mariadb, broker)
        print(f"(daemon log and lakehouse in {work})")
    p50, p95 = statistics.median(to_replica), percentile(to_replica, 0.95)
    met = p50 <= TARGET_P50 and p95 <= TARGET_P95
    print(f"\n{len(to_replica)} changes, commit -> changelog: p50 "
          f"{statistics.median(to_changelog):.1f}s, p95 {percentile(to_changelog, 0.95):.1f}s")
    print(f"commit -> replica: p50 {p50:.1f}s (target {TARGET_P50:.0f}s, ratio "
          f"{p50 / TARGET_P50:.2f}), p95 {p95:.1f}s (target {TARGET_P95:.0f}s, ratio "
          f"{p95 / TARGET_P95:.2f}): {'met' if met else 'MISSED'}")
    if to_mart:
        m50, m95 = statistics.median(to_mart), percentile(to_mart, 0.95)
        print(f"commit -> mart customer_revenue: p50 {m50:.1f}s, p95 {m95:.1f}s; against "
              f"the replica it reads: p50 ratio {m50 / p50:.2f}, p95 ratio {m95 / p95:.2f}")
    print("median seconds per stage: " + ", ".join(
        f"{k} {statistics.median(st[k] for st in stages if k in st):.1f}" for k in ALL_STAGES
        if any(k in st for st in stages)))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
