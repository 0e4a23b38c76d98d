"""E6: freshness under load: a busy schema, and a probe row timed to a reader outside Spark.

Starts its own stack in a temporary directory (the Kafka broker, MariaDB with a ROW
binlog, Debezium's MariaDB connector in Kafka Connect, the Spark Connect server that
replica builds share), a Dagster instance with the project's `setup/dagster.yaml`, and the
Dagster daemon over `workspace.yaml`'s binlake location, with the shipped `dagster:`
settings (both followers on): nothing drives the pipeline but the daemon, as under `make
dev`. The dbt location is left out: its models are the shop's, which these tables are not,
and each of its failing builds would take the Spark slot from the replica follower for a
minute. MariaDB holds `--tables` tables of 100 rows, each its own topic and replica. Once
every replica is built, a steady writer commits `--rate` single-row updates a second
spread over all tables; after a warm-up, a probe row is inserted into one table at a time
(each probe the next table), and timed from its commit to the moment its replica, read
with delta-rs by the README's reader contract (rows whose `_op` is not `d`), holds it.

Prints each probe, p50/p95 against the targets (p50 <= 15 s, p95 <= 30 s) as ratios, the
writer's achieved rate, the replica follower's cycle (the time between the starts of two
rounds of applies, and a round's span), and the host's CPU use and load while probing.

`--load-rows N`: during the probes, an initial load of `bulk.wide`, a table of N rows
(bench_load.py's, in a database the connector does not capture), into the replica `bulk`,
as `load_replica_job` reads it, in a process of its own; the replica follower then
applies it; the probes go on until the replica holds the load's rows. Printed too: the
load's seconds, when its rows were in the replica, and the probes' p95 against 10 s (the
target while a table loads).

    .venv/bin/python bench/bench_freshness_load.py --tables 50 --rate 200 [--probes 15]
        [--instance postgres]
    .venv/bin/python bench/bench_freshness_load.py --tables 10 --load-rows 2000000
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import dagster as dg
import yaml
from bench_freshness import percentile, stop_stack, wait_for_topic
from deltalake import DeltaTable

from binlog_assets.config import parse_config
from binlog_assets.dev.connect import DebeziumConnector, KafkaConnect
from binlog_assets.dev.kafka import KafkaBroker
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.dev.postgres import DAGSTER_PG_URL_ENV, PostgresServer, postgres_instance_yaml
from binlog_assets.dev.process import free_port
from binlog_assets.dev.spark_connect import SparkConnectServer
from binlog_assets.environment import REPO_ROOT
from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME, partition_key
from binlog_assets.orchestration.table_metadata import table_uri

TARGET_P50, TARGET_P95 = 15.0, 30.0
TARGET_P95_LOADING = 10.0
DB = "busy"
BULK_USER, BULK_PASSWORD = "binlake_load", "bench-pw"
LOAD_SCRIPT = """
import sys
from binlog_assets.config import load_config
from binlog_assets.load.tables import load_table, new_plan
from binlog_assets.parity.check import replica_sources
from binlog_assets.parity.lineage import lineage_placer
pipeline = load_config(sys.argv[1])
for source, db, table in replica_sources(pipeline, "bulk"):
    placer = lineage_placer(pipeline, source, db, dict(pipeline.kafka),
                            pipeline.kafka["group.id"])
    done = load_table(pipeline, source, db, table, new_plan(pipeline, db, table),
                      lineage=placer)
print(done.rows, done.seconds)
"""
ROWS = 100
POLL = 0.2
PROBE_BASE = 1_000_000


def create_bulk(mariadb: MariaDBServer, rows: int) -> None:
    """`bulk.wide` of `rows` rows (bench_load.py's table) and the load's account."""
    from bench_load import FILL, TABLE

    with mariadb.connect() as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE bench")  # FILL reads its sequence from there
        cur.execute("CREATE DATABASE bulk")
        cur.execute(TABLE.replace("bench.wide", "bulk.wide"))
        cur.execute(FILL.format(rows=int(rows)).replace("bench.wide", "bulk.wide"))
        cur.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (BULK_USER, BULK_PASSWORD))
        cur.execute("GRANT SELECT ON bulk.* TO %s@'%%'", (BULK_USER,))
        cur.execute("GRANT SELECT ON busy.* TO %s@'%%'", (BULK_USER,))
        cur.execute("GRANT BINLOG MONITOR ON *.* TO %s@'%%'", (BULK_USER,))


def topic(i: int) -> str:
    return f"{DB}.{DB}.t{i}"


def create_tables(conn, tables: int) -> None:
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {DB}")
        for i in range(tables):
            cur.execute(f"CREATE TABLE {DB}.t{i} (id INT PRIMARY KEY, v INT NOT NULL, "
                        f"note VARCHAR(40))")
            cur.execute(f"INSERT INTO {DB}.t{i} VALUES "
                        + ",".join(f"({r}, 0, 'row {r}')" for r in range(ROWS)))


class Writer(threading.Thread):
    """`rate` single-row updates a second, each on a random row of a random table."""

    def __init__(self, mariadb: MariaDBServer, tables: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.conn = mariadb.connect()
        self.tables, self.rate = tables, rate
        self.stop = threading.Event()
        self.done = 0
        self.began = 0.0

    def run(self) -> None:
        rng = random.Random(7)
        self.began = time.monotonic()
        with self.conn.cursor() as cur:
            while not self.stop.is_set():
                due = int((time.monotonic() - self.began) * self.rate)
                while self.done < due:
                    cur.execute(f"UPDATE {DB}.t{rng.randrange(self.tables)} SET v = v + 1 "
                                f"WHERE id = {rng.randrange(ROWS)}")
                    self.done += 1
                time.sleep(0.01)

    def achieved(self) -> float:
        return self.done / max(1e-9, time.monotonic() - self.began)


def replica_rows(uri: str) -> int:
    """Rows in the replica's files (0 before its first commit)."""
    if not DeltaTable.is_deltatable(uri):
        return 0
    return DeltaTable(uri).to_pyarrow_dataset().count_rows()


def visible(uri: str, ident: int) -> bool:
    """The reader contract outside Spark: the key is live in the replica table."""
    if not DeltaTable.is_deltatable(uri):
        return False
    rows = DeltaTable(uri).to_pyarrow_table(columns=["_op"], filters=[("id", "=", ident)])
    return any(op != "d" for op in rows.column("_op").to_pylist())


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the host since boot."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def follower_cycles(instance: dg.DagsterInstance, names: list[str], since: float
                    ) -> tuple[list[float], list[float]]:
    """Periods between the starts of consecutive rounds of replica applies, and each
    round's span, from the replicas' materializations after `since` (one changelog
    version per round)."""
    rounds: dict[int, list[float]] = {}
    for name in names:
        for record in instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey(["replica", name]),
                                      after_timestamp=since), limit=1000).records:
            version = record.asset_materialization.metadata["applied_changelog_version"].value
            rounds.setdefault(version, []).append(record.timestamp)
    starts = sorted((min(ts), max(ts) - min(ts)) for ts in rounds.values())
    periods = [b[0] - a[0] for a, b in zip(starts, starts[1:], strict=False)]
    return periods, [span for _start, span in starts]


def wait_built(instance: dg.DagsterInstance, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    missing = list(names)
    while missing:
        missing = [n for n in missing if not instance.fetch_materializations(
            dg.AssetKey(["replica", n]), limit=1).records]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(missing)} replicas not built in {timeout:.0f}s: "
                               f"{missing[:5]}")
        time.sleep(1)



def binlake_workspace(work: Path) -> Path:
    """`workspace.yaml` with its binlake location only (no dbt: see above)."""
    spec = yaml.safe_load((REPO_ROOT / "workspace.yaml").read_text())
    spec["load_from"] = [e for e in spec["load_from"]
                         if e["python_module"]["location_name"] == "binlake"]
    for entry in spec["load_from"]:
        entry["python_module"]["working_directory"] = str(REPO_ROOT)
    path = work / "workspace.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=50)
    parser.add_argument("--rate", type=float, default=200.0, help="changes a second, in all")
    parser.add_argument("--probes", type=int, default=15)
    parser.add_argument("--warmup", type=float, default=30.0,
                        help="seconds of load before the first probe")
    parser.add_argument("--pause", type=float, default=2.0,
                        help="seconds between one probe's visibility and the next")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--changelog-follow-seconds", type=float, default=600.0,
                        help="dagster.changelog_follow_seconds (0: the lag sensor launches "
                             "a consumer run per batch)")
    parser.add_argument("--follow-seconds", type=float, default=600.0,
                        help="dagster.replica_follow_seconds")
    parser.add_argument("--load-rows", type=int, default=0,
                        help="rows of a table loaded while probing (0: no load)")
    parser.add_argument("--instance", choices=("sqlite", "postgres"), default="sqlite",
                        help="the Dagster instance's storage: make dev's SQLite, or the "
                             "production PostgreSQL of setup/dagster-storage-postgres.yaml")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="binlake-busy-"))
    work.chmod(0o755)  # as root, PostgreSQL runs as its own user, who must reach its folder
    broker = KafkaBroker(work / "kafka")
    mariadb = MariaDBServer(work / "mariadb")
    connect: KafkaConnect | None = None
    spark: SparkConnectServer | None = None
    daemon: subprocess.Popen | None = None
    writer: Writer | None = None
    postgres = PostgresServer(work / "postgres") if args.instance == "postgres" else None
    names = [f"t{i}" for i in range(args.tables)]
    seconds: list[float] = []
    try:
        broker.start()
        mariadb.start()
        conn = mariadb.connect()
        create_tables(conn, args.tables)
        if args.load_rows:
            create_bulk(mariadb, args.load_rows)
        connect = KafkaConnect(work / "connect", broker.bootstrap_servers,
                               DebeziumConnector.for_server(mariadb, topic_prefix=DB,
                                                            database_include_list=(DB,)))
        connect.start()
        for i in range(args.tables):
            wait_for_topic(broker.bootstrap_servers, topic(i))
        settings = {
            "kafka": {"bootstrap.servers": broker.bootstrap_servers, "group.id": "busy",
                      "auto.offset.reset": "earliest", "isolation.level": "read_committed"},
            "lakehouse": {"path": str(work / "lakehouse"), "database": DB},
            "spark": {"remote": f"sc://127.0.0.1:{free_port()}"},
            "dagster": {"replica_follow_seconds": args.follow_seconds,
                        "changelog_follow_seconds": args.changelog_follow_seconds},
            "sources": [{"name": DB, "topics": [topic(i) for i in range(args.tables)],
                         "format": "debezium",
                         "tables": [{"source": f"{DB}.{n}", "replica": n} for n in names]}],
        }
        if args.load_rows:
            settings["sources"][0]["connection"] = {
                "host": "127.0.0.1", "port": mariadb.port, "user": BULK_USER,
                "password": BULK_PASSWORD}
            settings["sources"][0]["tables"].append({"source": "bulk.wide", "replica": "bulk"})
        pipeline = parse_config(settings)
        spark = SparkConnectServer.for_config(pipeline, work / "spark-connect")
        print(f"spark connect server ready in {spark.start():.1f}s", flush=True)
        config_path = work / "binlake.yaml"
        config_path.write_text(yaml.safe_dump(settings))
        home = work / "dagster"
        home.mkdir()
        env = {**os.environ, "BINLAKE_CONFIG": str(config_path), "DAGSTER_HOME": str(home)}
        if postgres is None:
            shutil.copy(REPO_ROOT / "setup" / "dagster.yaml", home / "dagster.yaml")
        else:
            print(f"postgres ready in {postgres.start():.1f}s", flush=True)
            (home / "dagster.yaml").write_text(postgres_instance_yaml())
            os.environ[DAGSTER_PG_URL_ENV] = env[DAGSTER_PG_URL_ENV] = postgres.url
        with dg.DagsterInstance.from_config(str(home)) as instance:
            instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME,
                                            [partition_key(topic(i), 0)
                                             for i in range(args.tables)])
            began = time.monotonic()
            with open(work / "daemon.log", "w") as log:
                daemon = subprocess.Popen(
                    [str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w",
                     str(binlake_workspace(work))],
                    cwd=REPO_ROOT, env=env, start_new_session=True, stdout=log,
                    stderr=subprocess.STDOUT)
            wait_built(instance, names, args.timeout)
            print(f"{args.tables} replicas built {time.monotonic() - began:.0f}s after the "
                  f"daemon started", flush=True)
            writer = Writer(mariadb, args.tables, args.rate)
            writer.start()
            time.sleep(args.warmup)
            if args.load_rows:
                loading = subprocess.Popen(
                    [sys.executable, "-c", LOAD_SCRIPT, str(config_path)], cwd=REPO_ROOT,
                    env=env, stdout=subprocess.PIPE, text=True)
                load_began = time.monotonic()
            probing = time.time()
            cpu0 = cpu_times()
            bulk_applied = None  # seconds from the load's start to its rows in the replica
            i = 0
            # While a table loads, the probes go on until its replica holds the load's
            # rows: the follower's apply of them is part of the load's cost to the others.
            while i < args.probes or (args.load_rows and bulk_applied is None):
                name = names[i % args.tables]
                ident = PROBE_BASE + i
                with conn.cursor() as cur:
                    cur.execute(f"INSERT INTO {DB}.{name} VALUES ({ident}, 0, 'probe')")
                committed = time.time()
                uri = table_uri(pipeline, name)
                while not visible(uri, ident):
                    if time.time() - committed > args.timeout:
                        raise TimeoutError(f"probe {i} in {name} not visible after "
                                           f"{args.timeout:.0f}s")
                    time.sleep(POLL)
                seconds.append(time.time() - committed)
                print(f"probe {i + 1:2d} ({name}): {seconds[-1]:5.1f}s; load "
                      f"{os.getloadavg()[0]:.2f}", flush=True)
                if args.load_rows and bulk_applied is None and replica_rows(
                        table_uri(pipeline, "bulk")) >= args.load_rows:
                    bulk_applied = time.monotonic() - load_began
                    print(f"the replica bulk holds the load's rows {bulk_applied:.0f}s "
                          f"after the load began", flush=True)
                if time.time() - probing > args.timeout:
                    raise TimeoutError(f"the replica bulk lacks the load's rows after "
                                       f"{args.timeout:.0f}s")
                i += 1
                time.sleep(args.pause)
            cpu1 = cpu_times()
            rate = writer.achieved()
            if args.load_rows:
                loaded = loading.communicate(timeout=args.timeout)[0].split()
                print(f"the load of {int(loaded[0]):,} rows took {float(loaded[1]):.1f}s "
                      f"(ended {time.monotonic() - load_began:.0f}s after it began; the "
                      f"probes took {time.time() - probing:.0f}s)", flush=True)
            periods, spans = follower_cycles(instance, names, probing)
    finally:
        if writer is not None:
            writer.stop.set()
        stop_stack(daemon, connect, spark, mariadb, broker)
        if postgres is not None:
            postgres.stop()
        print(f"(daemon log and lakehouse in {work})")
    p50, p95 = statistics.median(seconds), percentile(seconds, 0.95)
    met = p50 <= TARGET_P50 and p95 <= TARGET_P95
    busy = (cpu1[0] - cpu0[0]) / max(1.0, cpu1[1] - cpu0[1])
    print(f"\n{args.tables} tables, {rate:.0f} changes/s written (asked {args.rate:g}); "
          f"{len(seconds)} probes, commit -> replica read by delta-rs: p50 {p50:.1f}s "
          f"(target {TARGET_P50:.0f}s, ratio {p50 / TARGET_P50:.2f}), p95 {p95:.1f}s "
          f"(target {TARGET_P95:.0f}s, ratio {p95 / TARGET_P95:.2f}): "
          f"{'met' if met else 'MISSED'}")
    if periods:
        print(f"replica follower: a round every {statistics.median(periods):.1f}s (median "
              f"of {len(periods)}), a round's applies span {statistics.median(spans):.1f}s")
    print(f"host CPU busy {busy:.0%} of 2 cores while probing; load {os.getloadavg()[0]:.2f}")
    if args.load_rows:
        print(f"while a table of {args.load_rows:,} rows loaded: p95 {p95:.1f}s against "
              f"{TARGET_P95_LOADING:.0f}s: "
              f"{'met' if p95 <= TARGET_P95_LOADING else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
