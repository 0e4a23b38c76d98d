"""The soak: the shipped automation under a source workload and faults on a seeded schedule.

What runs, as `make dev` runs it but on a PostgreSQL Dagster instance (the production
storage of `setup/dagster-storage-postgres.yaml`): the Kafka broker, MariaDB with a ROW
binlog, Debezium in Kafka Connect, the Spark Connect server, Redis, a code server for the
`binlake` location (`dagster code-server start`, what `dagster dev` starts per location)
and `dagster-daemon` with the shipped `dagster:` settings (the changelog follower and the
replica follower on). Nothing drives the pipeline but the daemon. The dbt location is
left out (its models are the shop's; see bench/bench_freshness_load.py).

The workload: `--tables` tables in MariaDB (`soak.t<i>`), each its own topic and replica,
with seeded inserts, updates and deletes, an added column (ALTER ADD COLUMN) on a few
tables, a TRUNCATE, UPDATEs of a primary-key value, and malformed records produced
straight into the source topics (each must reach the dead-letter topic with its
coordinates). The handlers (`soak_handlers.py`) count every call per event, and keep the
README's Redis cache example of `soak.t0`.

Faults (each timed and recorded): broker restart, broker frozen (SIGSTOP, SIGCONT),
Kafka Connect restart, MariaDB restart, SIGKILL of the consume run (the changelog
follower run, the process that reads Kafka and calls the handlers), SIGKILL of the
replica follower run, Spark Connect server restart, daemon restart, code location reload
(the code server's reload, as the UI's Reload button), the code server's child killed
(the process that serves the location; `make dev`'s watch, `binlog_assets.dev.code_watch`,
runs here too and must reload it), a failover of MariaDB to its GTID replica (a lower
binlog numbering the first time, and back the next: the README's runbook), and a
re-snapshot (the connector's offsets lost while writes go on). A location that stays unanswered for
LOCATION_LOST_AFTER seconds ends the soak at once, naming it. At the end the workload stops,
the pipeline drains, and the soak checks: each replica equals its table (delta-rs, the
README's `_op` filter), the cache equals its table, every malformed record is in the
dead-letter topic with its coordinates, every partition's committed offset is at its end
(lag 0), every run ended (the killed ones failed, named by run monitoring), handler calls
beyond the first per event (attributed to the fault before them; none with no fault),
and what each long-lived process and store measured at the start and the end.

    python tests/soak/soak.py --minutes 30 --seed 1 [--tables 20] [--faults a,b,...]

The report goes to `var/soak/report.json` and `report.md` (`--report DIR` moves them);
the exit status is 0 when every check passed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for _extra in (HERE, ROOT / "tests" / "drills", ROOT / "tests" / "lakehouse", ROOT):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

import dagster as dg  # noqa: E402
import yaml  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from deltalake import DeltaTable  # noqa: E402
from drill_lib import dead_letter_coordinates  # noqa: E402
from lake_events import LIVE_OPS  # noqa: E402
from soak_handlers import DATABASE, cache, parse_coordinate, read_calls  # noqa: E402

from binlog_assets.config import parse_config  # noqa: E402
from binlog_assets.dev.code_watch import CodeWatch, Endpoint, with_heartbeat_ttl  # noqa: E402
from binlog_assets.dev.connect import (  # noqa: E402
    DebeziumConnector,
    DebeziumFence,
    KafkaConnect,
)
from binlog_assets.dev.dagster_dev import terminate_runs  # noqa: E402
from binlog_assets.dev.demo import wait_for_debezium  # noqa: E402
from binlog_assets.dev.kafka import KafkaBroker  # noqa: E402
from binlog_assets.dev.mariadb import MariaDBServer  # noqa: E402
from binlog_assets.dev.postgres import (  # noqa: E402
    DAGSTER_PG_URL_ENV,
    PostgresServer,
    postgres_instance_yaml,
)
from binlog_assets.dev.process import free_port, terminate  # noqa: E402
from binlog_assets.dev.redis import REDIS_URL_ENV, RedisServer  # noqa: E402
from binlog_assets.dev.spark_connect import SparkConnectServer  # noqa: E402
from binlog_assets.examples.customer_cache import cell_text  # noqa: E402
from binlog_assets.lakehouse.changelog import changelog_uri  # noqa: E402
from binlog_assets.orchestration.maintenance import MAINTENANCE_JOB_NAME  # noqa: E402
from binlog_assets.orchestration.partitions import (  # noqa: E402
    CHANGELOG_ASSET_KEY,
    KAFKA_PARTITIONS_NAME,
    partition_key,
)
from binlog_assets.orchestration.replica_follower import FOLLOW_JOB_NAME  # noqa: E402
from binlog_assets.orchestration.shared import CHANGELOG_FOLLOW_JOB_NAME  # noqa: E402
from binlog_assets.orchestration.table_metadata import table_uri  # noqa: E402
from binlog_assets.procfs import children, processes  # noqa: E402

FAULTS = ("broker_restart", "broker_freeze", "connect_restart", "mariadb_restart",
          "kill_consume_run", "kill_follower_run", "spark_restart", "daemon_restart",
          "code_reload", "code_server_kill", "failover", "resnapshot")
# Faults that end a process doing handler work: handler calls beyond the first are the
# README's at-least-once after them. After any other fault a repeat means a run failed
# (and its log says why), which the report names.
KILLS = ("kill_consume_run",)
ROWS = 30
# What the soak sets in its own environment too (the Dagster processes get them all).
ENV = ("BINLAKE_CONFIG", "DAGSTER_HOME", DAGSTER_PG_URL_ENV, REDIS_URL_ENV)
DLQ = f"binlake.dlq.{DATABASE}"
# The tag of the runs the soak submits itself (maintenance), as a schedule tags its own.
SOAK_TAG = "binlake/soak"
# Faults the pipeline's runs cannot see: nothing of Dagster's is disturbed (a daemon
# restart, a code location reload: the runs go on in their processes), or only the source
# is (Kafka Connect or MariaDB restarted: Debezium resumes from its offsets, and Kafka
# just receives no records for a while, which no run can tell from a quiet source; a
# failover or a re-snapshot: the records go on, placed in the source's lineages, and only
# a failover to a lower binlog numbering says so, in a run's warning).
# `faults_visible` lists them instead of asking for evidence.
NOT_VISIBLE = ("daemon_restart", "code_reload", "connect_restart", "mariadb_restart",
               "code_server_kill", "failover", "resnapshot")
# A location unanswered this long (its watch's reloads included) has been lost: the soak
# ends there rather than wait out its workload and drain with nothing running.
LOCATION_LOST_AFTER = 300.0
# A maintenance tick whose submit failed is tried again this soon, as the scheduler runs a
# tick the code location's outage failed once the location answers.
MAINTENANCE_RETRY_SECONDS = 5.0
# What an evidence line of each other kind must say: the killed run failed; Kafka or its
# broker, a commit to it (the group coordinator) or librdkafka's transport error; Spark.
EVIDENCE = {
    "kill_consume_run": r"^killed run \w+: FAILURE$",
    "kill_follower_run": r"^killed run \w+: FAILURE$",
    "broker_restart": r"(?i)kafka|broker|coordinator|_TRANSPORT",
    "broker_freeze": r"(?i)kafka|broker|coordinator|_TRANSPORT",
    "spark_restart": r"(?i)spark",
}
# Faults whose trace may come after the next fault began: a replica follower's apply
# waits in the Spark Connect client's retries well past the server's restart.
LATE_EVIDENCE = ("spark_restart",)
# A broker freeze strikes a changelog follower run this long after its start: past its
# set-up, into its rounds.
FIRST_ROUNDS_SECONDS = 20.0
# The jobs whose runs hold a Spark Connect session.
SPARK_JOBS = (FOLLOW_JOB_NAME, MAINTENANCE_JOB_NAME)
RUNNING = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
           dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
           dg.DagsterRunStatus.CANCELING)


def topic(i: int) -> str:
    return f"{DATABASE}.{DATABASE}.t{i}"


def log(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", flush=True)


def begin(starts: dict[str, Any]) -> Any:
    """Call each of `starts` in its own thread; returns the join: it waits for them all
    and gives the seconds each took (raising the first error)."""
    took: dict[str, float] = {}
    errors: list[BaseException] = []

    def one(name: str, start: Any) -> None:
        began = time.monotonic()
        try:
            start()
        except BaseException as e:
            errors.append(e)
        took[name] = round(time.monotonic() - began, 1)
        log(f"{name} ready in {took[name]:.1f}s")

    threads = [threading.Thread(target=one, args=item, name=f"start-{item[0]}")
               for item in starts.items()]
    for thread in threads:
        thread.start()

    def join() -> dict[str, float]:
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return took

    return join


def parallel(starts: dict[str, Any]) -> dict[str, float]:
    """Call each of `starts` at once; the seconds each took (the first error raised once
    all ended)."""
    return begin(starts)()


# --- the workload -----------------------------------------------------------------------

class Workload(threading.Thread):
    """Seeded DML over the tables at `rate` statements a second, the rarer changes at set
    fractions of `seconds`, and a malformed record into a source topic every
    `malformed_every` seconds. MariaDB restarts make statements fail: the writer
    reconnects and goes on (the end state is compared, not each statement)."""

    def __init__(self, primary: Callable[[], MariaDBServer], bootstrap: str, tables: int,
                 rate: float, seconds: float, seed: int, malformed_every: float) -> None:
        super().__init__(daemon=True, name="soak-workload")
        self.primary, self.tables, self.rate, self.seconds = primary, tables, rate, seconds
        # Cleared while the source fails over: the application stops writing too.
        self.writing = threading.Event()
        self.writing.set()
        self.rng = random.Random(seed)
        self.malformed_every = malformed_every
        self.stop = threading.Event()
        self.ops: Counter = Counter()
        self.failed = 0
        self.next_id = [ROWS] * tables
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                  "message.timeout.ms": 600_000, "log_level": 0})
        self.malformed: list[tuple[str, int, int]] = []  # acknowledged coordinates
        self.malformed_lost = 0
        # (fraction of the run, statement, what it is)
        pk, alter = min(5, tables - 1), [t for t in (3, 7, 11) if t < tables]
        self.specials = sorted(
            [(0.2 + 0.1 * n, f"ALTER TABLE {DATABASE}.t{t} ADD COLUMN extra{n} "
              f"VARCHAR(20) NULL DEFAULT 'x{n}'", "alter") for n, t in enumerate(alter)]
            + [(0.45, f"TRUNCATE TABLE {DATABASE}.t{min(4, tables - 1)}", "truncate")]
            + [(f, f"UPDATE {DATABASE}.t{pk} SET id = id + 1000000 WHERE id = "
                f"(SELECT m FROM (SELECT MIN(id) m FROM {DATABASE}.t{pk}) x)", "pk_update")
               for f in (0.3, 0.6)])
        self.specials_done: list[tuple[float, str]] = []

    def run(self) -> None:
        conn = server = None
        began = time.monotonic()
        done = 0
        next_malformed = began + self.malformed_every / 2
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_malformed:
                self._produce_malformed()
                next_malformed = now + self.malformed_every
            if not self.writing.is_set():
                if conn is not None:
                    conn.close()
                conn = None
                self.stop.wait(0.1)
                continue
            try:
                if conn is None or server is not self.primary():
                    if conn is not None:
                        conn.close()
                    server = self.primary()
                    conn = server.connect()
                due = int((now - began) * self.rate)
                with conn.cursor() as cur:
                    while self.specials and (now - began) >= self.specials[0][0] * self.seconds:
                        _fraction, sql, kind = self.specials[0]
                        cur.execute(sql)
                        self.specials.pop(0)
                        self.ops[kind] += 1
                        self.specials_done.append((time.time(), kind))
                    while done < due and not self.stop.is_set():
                        cur.execute(*self._statement())
                        done += 1
            except Exception as e:
                self.failed += 1
                with contextlib.suppress(Exception):
                    if conn is not None:
                        conn.close()
                conn = None
                if self.failed % 20 == 1:
                    log(f"workload: {type(e).__name__}: {e}")
                self.stop.wait(0.5)
                continue
            self.stop.wait(0.02)
        if conn is not None:
            conn.close()

    def _statement(self) -> tuple[str, tuple]:
        t = self.rng.randrange(self.tables)
        table = f"{DATABASE}.t{t}"
        kind = self.rng.choices(("insert", "update", "delete"), (4, 4, 2))[0]
        self.ops[kind] += 1
        if kind == "insert":
            self.next_id[t] += 1
            return (f"INSERT INTO {table} (id, v, note) VALUES (%s, %s, %s)",
                    (self.next_id[t], self.rng.randrange(1000), f"n{self.rng.randrange(99)}"))
        ident = self.rng.randrange(self.next_id[t] + 1)
        if kind == "update":
            return (f"UPDATE {table} SET v = v + 1, note = %s WHERE id = %s",
                    (f"u{self.rng.randrange(99)}", ident))
        return f"DELETE FROM {table} WHERE id = %s", (ident,)

    def _produce_malformed(self) -> None:
        """A record no decoder takes, into a source topic; its coordinates once acked."""
        def acked(err, msg) -> None:
            if err is None:
                self.malformed.append((msg.topic(), msg.partition(), msg.offset()))
            else:
                self.malformed_lost += 1

        t = self.rng.randrange(self.tables)
        value = self.rng.choice([b"not json {", b'{"payload": [1, 2', b'"a string"',
                                 b"\x00\x01\x02\xff"])
        self.producer.produce(topic(t), key=b'{"id": -1}', value=value, on_delivery=acked)
        self.producer.poll(0)

    def finish(self) -> None:
        self.stop.set()
        self.join(60)
        left = self.producer.flush(120)
        if left:
            raise RuntimeError(f"{left} malformed records not acknowledged in 120 s")


class Maintenance(threading.Thread):
    """`lakehouse_maintenance_job` every `every` seconds while everything else runs, as
    its nightly schedule would submit it (through the instance's run queue): a turn
    whose last run has not ended is skipped, as a schedule's tick is not (a schedule
    would queue it behind; the soak keeps one at a time, like one night's)."""

    def __init__(self, soak: Soak, every: float) -> None:
        super().__init__(daemon=True, name="soak-maintenance")
        self.soak, self.every = soak, every
        self.stop = threading.Event()
        self.run_ids: list[str] = []
        self.skipped = 0
        self.errors: list[str] = []
        self.missed = False

    def run(self) -> None:
        wait = self.every
        while not self.stop.wait(wait):
            self.missed = not self._turn()
            wait = MAINTENANCE_RETRY_SECONDS if self.missed else self.every

    def _turn(self) -> bool:
        """One tick; False when its submit failed (the code location unreachable, say):
        the scheduler runs such a tick once the location answers again."""
        try:
            if self.run_ids and self._unfinished(self.run_ids[-1]):
                self.skipped += 1
                return True
            self.run_ids.append(self.soak.submit(MAINTENANCE_JOB_NAME))
            log(f"maintenance run {self.run_ids[-1][:8]} submitted")
            return True
        except Exception as e:
            stderr = getattr(e, "stderr", None) or b""
            error = f"{type(e).__name__}: {str(e)[:200]} {stderr[-300:].decode(errors='replace')}"
            self.errors.append(error)
            log(f"maintenance submit failed, again in {MAINTENANCE_RETRY_SECONDS:.0f} s: "
                f"{error}")
            return False

    def _unfinished(self, run_id: str) -> bool:
        with self.soak.instance() as instance:
            run = instance.get_run_by_id(run_id)
        return run is not None and run.status in RUNNING

    def finish(self, timeout: float) -> dict[str, Any]:
        """Stop submitting, wait for the last run to end; each run's status and times,
        and what its compaction of the changelog recorded."""
        self.stop.set()
        self.join(200)
        deadline = time.monotonic() + timeout
        # A tick the location's outage failed just before the end still runs.
        while self.missed and time.monotonic() < deadline:
            self.missed = not self._turn()
            if self.missed:
                time.sleep(MAINTENANCE_RETRY_SECONDS)
        while self.run_ids and self._unfinished(self.run_ids[-1]) \
                and time.monotonic() < deadline:
            time.sleep(2)
        runs = []
        with self.soak.instance() as instance:
            for run_id in self.run_ids:
                record = instance.get_run_record_by_id(run_id)
                compacted = [e.asset_observation.metadata for e in (
                    r.event_log_entry.dagster_event.event_specific_data
                    for r in instance.get_records_for_run(
                        run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION).records)
                    if "files_after" in e.asset_observation.metadata
                    and e.asset_observation.asset_key == CHANGELOG_ASSET_KEY]
                created = record.create_timestamp.timestamp()
                runs.append({
                    "run_id": run_id, "status": record.dagster_run.status.value,
                    "began": record.start_time, "ended": record.end_time,
                    # in the queue (the spark pool's slot) and then running, seconds
                    "queued_s": round((record.start_time or created) - created, 1),
                    "ran_s": round((record.end_time or 0) - (record.start_time or 0), 1),
                    "changelog_files": [(m["files_before"].value, m["files_after"].value)
                                        for m in compacted]})
        return {"every_s": self.every, "runs": runs, "skipped_turns": self.skipped,
                "submit_errors": self.errors}


class Progress(threading.Thread):
    """Samples the Delta versions of the changelog and of a few replicas every `every`
    seconds, so each fault's recovery can be read off: the first commit after it."""

    def __init__(self, uris: dict[str, str], every: float = 3.0) -> None:
        super().__init__(daemon=True, name="soak-progress")
        self.uris, self.every = uris, every
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            versions = {}
            for name, uri in self.uris.items():
                with contextlib.suppress(Exception):
                    versions[name] = DeltaTable(uri).version()
            self.samples.append((time.time(), versions))

    def first_commit_after(self, when: float, names: list[str]) -> float | None:
        """Seconds from `when` to the first sample where one of `names` moved past the
        version it had at `when`."""
        before = [v for t, v in self.samples if t <= when]
        base = before[-1] if before else {}
        for t, versions in self.samples:
            if t > when and any(versions.get(n, -1) > base.get(n, -1) for n in names):
                return round(t - when, 1)
        return None


# --- the stack --------------------------------------------------------------------------

@dataclass
class Soak:
    work: Path
    tables: int = 20
    seed: int = 1
    group: str = "soak"
    broker: KafkaBroker = field(init=False)
    mariadb: MariaDBServer = field(init=False)  # the primary of the moment
    standby: MariaDBServer = field(init=False)  # its GTID replica, promoted by `failover`
    switches: int = 0  # failovers so far
    workload: Workload | None = None
    postgres: PostgresServer = field(init=False)
    redis: RedisServer = field(init=False)
    connect: KafkaConnect | None = None
    spark: SparkConnectServer | None = None
    code_server: subprocess.Popen | None = None
    daemon: subprocess.Popen | None = None
    code_port: int = 0
    watch: CodeWatch | None = None
    env: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    started: list[subprocess.Popen] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # each part's start, seconds

    def __post_init__(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.work.chmod(0o755)  # as root, PostgreSQL runs as its own user
        # Its port known before it starts: the config (and Spark Connect's, from it) is
        # written while the broker starts.
        self.broker = KafkaBroker(self.work / "kafka", port=free_port(), c1=True)
        self.mariadb = MariaDBServer(self.work / "mariadb", server_id=1)
        self.standby = MariaDBServer(self.work / "standby", server_id=2)
        self.postgres = PostgresServer(self.work / "postgres")
        self.redis = RedisServer(self.work / "redis")

    @property
    def topics(self) -> list[str]:
        return [DATABASE, *(topic(i) for i in range(self.tables))]

    @property
    def names(self) -> list[str]:
        return [f"t{i}" for i in range(self.tables)]

    @property
    def kafka_conf(self) -> dict[str, str]:
        return {"bootstrap.servers": self.broker.bootstrap_servers}

    def start(self) -> None:
        """The stack, its parts at once where they need nothing of each other (on 2 cores
        a start is mostly a wait: a JVM loading classes, a server opening its port).
        Spark Connect (a JVM and a session, the longest) starts with the first ones and
        runs on while Kafka Connect (Debezium's snapshot needs MariaDB and the broker)
        and the code server start; the daemon once all are up. Each part's seconds in
        `self.timings`."""
        self.settings = {
            "kafka": {"bootstrap.servers": self.broker.bootstrap_servers,
                      "group.id": self.group, "auto.offset.reset": "earliest",
                      "isolation.level": "read_committed"},
            "lakehouse": {"path": str(self.work / "lakehouse"), "database": DATABASE},
            "spark": {"master": "local[2]", "remote": f"sc://127.0.0.1:{free_port()}",
                      "parallel_replicas": 3, "conf": {"spark.driver.memory": "2g"}},
            # The shipped binlake.yaml's dagster settings.
            "dagster": yaml.safe_load((ROOT / "binlake.yaml").read_text())["dagster"],
            "sources": [{"name": DATABASE, "topics": self.topics, "format": "debezium",
                         "ordering": "key", "lanes": 16,
                         "handlers": "soak_handlers:registry",
                         "tables": [{"source": f"{DATABASE}.{n}", "replica": n}
                                    for n in self.names]}],
        }
        self.spark = SparkConnectServer.for_config(self.pipeline, self.work / "spark-connect")
        spark = begin({"spark_connect": self.spark.start})
        self.timings.update(parallel({
            "postgres": self.postgres.start, "kafka": self.broker.start,
            "mariadb": self.mariadb.start, "standby": self.standby.start,
            "redis": self.redis.start}))
        began = time.monotonic()
        # The primary's binlog numbering above the standby's, whose is reset when it
        # starts replicating: a failover goes to a lower numbering (the hard case).
        self.mariadb.rotate_binlog(3)
        with self.mariadb.connect() as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {DATABASE}")
            for i in range(self.tables):
                cur.execute(f"CREATE TABLE {DATABASE}.t{i} (id INT PRIMARY KEY, "
                            f"v INT NOT NULL, note VARCHAR(40))")
                cur.execute(f"INSERT INTO {DATABASE}.t{i} VALUES "
                            + ",".join(f"({r}, {r}, 'row {r}')" for r in range(ROWS)))
        self.standby.replicate_from(self.mariadb)
        self.standby.wait_replicated(self.mariadb)
        self.timings["tables"] = round(time.monotonic() - began, 1)
        self.connect = KafkaConnect(self.work / "connect", self.broker.bootstrap_servers,
                                    DebeziumConnector.for_server(self.mariadb,
                                                                 topic_prefix=DATABASE))
        config_path = self.work / "binlake.yaml"
        config_path.write_text(yaml.safe_dump(self.settings))
        home = self.work / "dagster"
        home.mkdir(exist_ok=True)
        (home / "dagster.yaml").write_text(postgres_instance_yaml())
        self.env = {**with_heartbeat_ttl(dict(os.environ)), "BINLAKE_CONFIG": str(config_path),
                    "DAGSTER_HOME": str(home), DAGSTER_PG_URL_ENV: self.postgres.url,
                    REDIS_URL_ENV: self.redis.url, "DAGSTER_TELEMETRY_DISABLED": "1",
                    "PYTHONPATH": os.pathsep.join(
                        [str(HERE), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        # This process reads the same instance (terminate_runs reads DAGSTER_HOME).
        for key in ENV:
            os.environ[key] = self.env[key]
        with self.instance() as instance:
            instance.add_dynamic_partitions(
                KAFKA_PARTITIONS_NAME, [partition_key(t, 0) for t in self.topics])
        self.code_port = free_port()
        self.timings.update(parallel({
            "connect_debezium": self.connect.start, "code_server": self.start_code_server}))
        began = time.monotonic()
        self.timings.update(spark())
        self.timings["spark_wait"] = round(time.monotonic() - began, 1)
        began = time.monotonic()
        self.start_daemon()
        self.timings["daemon_spawn"] = round(time.monotonic() - began, 1)
        # As `make dev` watches the code servers of its `dagster dev`.
        self.watch = CodeWatch(lambda: [Endpoint("binlake", "127.0.0.1", self.code_port)],
                               log=log)
        self.watch.start()

    @property
    def pipeline(self):
        return parse_config(self.settings)

    def instance(self) -> dg.DagsterInstance:
        return dg.DagsterInstance.from_config(self.env["DAGSTER_HOME"])

    def _dagster(self, name: str, args: list[str], log_name: str) -> subprocess.Popen:
        with open(self.work / log_name, "ab") as out:
            proc = subprocess.Popen(
                [str(Path(sys.executable).with_name(name)), *args], cwd=ROOT, env=self.env,
                start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
        self.started.append(proc)
        return proc

    def start_code_server(self) -> float:
        """The `binlake` location's code server, as `dagster dev` starts one per location;
        the seconds until it answered."""
        began = time.monotonic()
        self.code_server = self._dagster(
            "dagster", ["code-server", "start", "-m", "binlog_assets.definitions",
                        "--location-name", "binlake", "-h", "127.0.0.1",
                        "-p", str(self.code_port), "--working-directory", str(ROOT)],
            "code-server.log")
        workspace = {"load_from": [{"grpc_server": {
            "host": "127.0.0.1", "port": self.code_port, "location_name": "binlake"}}]}
        (self.work / "workspace.yaml").write_text(yaml.safe_dump(workspace))
        self.wait_code_server()
        return time.monotonic() - began

    def code_client(self):
        from dagster._grpc.client import DagsterGrpcClient

        return DagsterGrpcClient(port=self.code_port, host="127.0.0.1")

    def wait_code_server(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                self.code_client().ping("soak")
                return
            time.sleep(1)
        raise TimeoutError(f"code server not up in {timeout:.0f}s")

    def sleep(self, seconds: float) -> None:
        """Sleep `seconds`, ending the soak at once if the code location is lost."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 2.0))
            if self.watch is not None and \
                    (lost := self.watch.unanswered_for()) > LOCATION_LOST_AFTER:
                raise RuntimeError(
                    f"the code location has not answered for {lost:.0f}s "
                    f"(reloads: {self.watch.reloads})")

    def code_server_child(self) -> int | None:
        """The `dagster api grpc` process the code server serves the location from: its
        newest (after a reload the old child lives on until its runs end)."""
        if self.code_server is None:
            return None
        grpc = [p.pid for p in children(self.code_server.pid) if "grpc" in p.cmdline()]
        return grpc[-1] if grpc else None

    def start_daemon(self) -> None:
        self.daemon = self._dagster("dagster-daemon",
                                    ["run", "-w", str(self.work / "workspace.yaml")],
                                    "daemon.log")

    def stop_daemon(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            os.killpg(self.daemon.pid, signal.SIGTERM)
            try:
                self.daemon.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.daemon.pid, signal.SIGKILL)
                self.daemon.wait()
        self.daemon = None

    def stop(self) -> None:
        """Everything this soak started: the daemon, the runs, the code server, the stack."""
        if self.watch is not None:
            self.watch.stop.set()
        self.stop_daemon()
        with contextlib.suppress(Exception):
            if self.code_server is not None and self.code_server.poll() is None:
                terminate_runs(30.0)
        for proc in self.started:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        for pid in self.run_pids():  # a run process that outlived its code server
            terminate(pid, 10)
        for service in (self.connect, self.spark, self.mariadb, self.standby, self.broker,
                        self.redis, self.postgres):
            if service is not None:
                with contextlib.suppress(Exception):
                    service.stop()

    # --- runs and processes ---

    def run_pids(self, run_id: str | None = None) -> list[int]:
        """Processes executing a run of this soak, of one run when `run_id` is given.

        The code server starts each run as a multiprocessing child whose command line
        does not name the run; its compute-log `tail` children do (the run's folder
        under the instance's storage), so a run's process is their parent."""
        if "DAGSTER_HOME" not in self.env:  # stopped before its instance was set up
            return []
        storage = f"{self.env['DAGSTER_HOME']}/storage/{run_id or ''}"
        pids = {p.ppid for p in processes()
                if (cmd := " ".join(p.cmdline())).startswith("tail ") and storage in cmd}
        return sorted(p for p in pids if p > 1)

    def consuming_through(self, seconds: float, timeout: float = 120.0) -> str | None:
        """A changelog follower run that has run its first rounds and goes on for
        `seconds` more (the follow seconds of the shipped config), waiting up to
        `timeout` for one; its id, or None."""
        follow = self.pipeline.dagster.changelog_follow_seconds
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.instance() as instance:
                records = instance.get_run_records(dg.RunsFilter(
                    job_name=CHANGELOG_FOLLOW_JOB_NAME,
                    statuses=[dg.DagsterRunStatus.STARTED]))
            for record in records:
                age = time.time() - (record.start_time or time.time())
                if age >= FIRST_ROUNDS_SECONDS and age + seconds + 15 < follow:
                    return record.dagster_run.run_id
            time.sleep(1)
        return None

    def running(self, job: str) -> list[dg.DagsterRun]:
        with self.instance() as instance:
            return [r.dagster_run for r in instance.get_run_records(
                dg.RunsFilter(job_name=job, statuses=[dg.DagsterRunStatus.STARTED]))]

    def submit(self, job: str) -> str:
        """Submit a run of `job` to the instance's run queue, as a schedule's tick does
        (`dagster job launch` on the workspace: the run is created from the code
        server's snapshot of the job and handed to the instance's QueuedRunCoordinator,
        the daemon dequeues it under the pools' and tags' limits); its run id."""
        run_id = str(uuid.uuid4())
        subprocess.run(
            [str(Path(sys.executable).with_name("dagster")), "job", "launch",
             "-w", str(self.work / "workspace.yaml"), "-l", "binlake", "-j", job,
             "--run-id", run_id, "--tags", json.dumps({SOAK_TAG: job})],
            cwd=ROOT, env=self.env, check=True, capture_output=True, timeout=180)
        return run_id

    def drained(self, ends: dict[str, int]) -> dict[str, int]:
        """Lag per partition: end offset minus the group's committed offset."""
        consumer = Consumer({**self.kafka_conf, "group.id": self.group,
                             "enable.auto.commit": False})
        try:
            parts = [TopicPartition(k.rsplit(":", 1)[0], int(k.rsplit(":", 1)[1]))
                     for k in ends]
            committed = consumer.committed(parts, timeout=30)
        finally:
            consumer.close()
        return {f"{tp.topic}:{tp.partition}": ends[f"{tp.topic}:{tp.partition}"]
                - max(tp.offset, 0) for tp in committed}


# --- faults -----------------------------------------------------------------------------

@dataclass
class Fault:
    kind: str
    planned: float          # seconds into the workload
    began: float = 0.0      # wall clock
    ended: float = 0.0
    struck: float = 0.0     # when a kill's signal went (it waits for a run to kill first)
    detail: str = ""
    target: str = ""        # the run id a kill hit
    exposed: list[str] = field(default_factory=list)  # the runs using Spark a restart met
    skipped: bool = False
    visible: list[str] = field(default_factory=list)
    # seconds from the fault's end to the next changelog commit and replica commit
    recovered_changelog_s: float | None = None
    recovered_replicas_s: float | None = None


def schedule(kinds: list[str], repeats: int, seconds: float, seed: int) -> list[Fault]:
    """`repeats` faults of each kind spread over the middle of the run in a seeded order,
    each in its own slot with a seeded offset."""
    rng = random.Random(seed)
    order = [k for k in kinds for _ in range(repeats)]
    rng.shuffle(order)
    first, last = 0.1 * seconds, 0.85 * seconds
    slot = (last - first) / max(1, len(order))
    return [Fault(kind, first + i * slot + rng.uniform(0, 0.3 * slot))
            for i, kind in enumerate(order)]


def inject(soak: Soak, fault: Fault, rng: random.Random) -> None:
    kind = fault.kind
    if kind == "broker_restart":
        soak.broker.stop()
        time.sleep(rng.uniform(2, 8))
        fault.detail = f"broker down, back in {soak.broker.start():.1f}s"
    elif kind == "broker_freeze":
        seconds = rng.uniform(10, 30)
        # Struck while a changelog follower consumes and goes on for the whole freeze:
        # one struck between two follower runs met neither (the gap was 11 s, the next
        # run's first wait under the 5 s a run names), and could not be seen.
        consuming = soak.consuming_through(seconds)
        pid = soak.broker.running_pid()
        fault.struck = time.time()
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
        under = (f"under follower run {consuming[:8]}" if consuming
                 else "no follower run consuming through it")
        fault.detail = f"broker pid {pid} stopped {seconds:.1f}s, {under}"
    elif kind == "connect_restart":
        soak.connect.stop()
        fault.detail = f"connect back in {soak.connect.start():.1f}s"
    elif kind == "mariadb_restart":
        soak.mariadb.stop()
        time.sleep(rng.uniform(1, 5))
        fault.detail = f"mariadb back in {soak.mariadb.start():.1f}s"
    elif kind in ("kill_consume_run", "kill_follower_run"):
        job = CHANGELOG_FOLLOW_JOB_NAME if kind == "kill_consume_run" else FOLLOW_JOB_NAME
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for run in soak.running(job):
                pids = soak.run_pids(run.run_id)
                if pids:
                    time.sleep(rng.uniform(0, 3))
                    fault.struck = time.time()
                    for pid in pids:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    fault.target, fault.detail = run.run_id, f"SIGKILL pids {pids}"
                    return
            time.sleep(1)
        fault.skipped, fault.detail = True, f"no {job} run running in 120 s"
    elif kind == "spark_restart":
        # The runs with a Spark session then, their process alive (a follower just
        # SIGKILLed is STARTED until monitoring fails it): with none, no run can tell.
        def using_spark() -> set[str]:
            return {r.run_id for job in SPARK_JOBS for r in soak.running(job)
                    if soak.run_pids(r.run_id)}

        exposed = using_spark()
        stopping = time.monotonic()
        soak.spark.stop()  # its port free too
        fault.detail = f"stopped in {time.monotonic() - stopping:.1f}s, "
        try:
            back = soak.spark.start()
        except Exception as e:
            # An operator starts it again: a warm-up that timed out under load once left
            # the stack without a server for the rest of the soak.
            fault.detail += f"first start failed ({type(e).__name__}: {str(e)[:200]}), "
            soak.spark.stop()
            back = soak.spark.start()
        fault.detail += f"spark connect back in {back:.1f}s"
        exposed |= using_spark()
        fault.exposed = sorted(exposed)
        if not exposed:
            fault.detail += "; no run used Spark meanwhile"
    elif kind == "daemon_restart":
        soak.stop_daemon()
        time.sleep(rng.uniform(1, 5))
        soak.start_daemon()
        fault.detail = "daemon restarted"
    elif kind == "code_server_kill":
        child = soak.code_server_child()
        if child is None:
            fault.skipped, fault.detail = True, "no code server child"
            return
        os.kill(child, signal.SIGKILL)
        began = time.monotonic()
        soak.wait_code_server(timeout=LOCATION_LOST_AFTER)
        fault.detail = (f"SIGKILL code server child {child}; the location answered again "
                        f"{time.monotonic() - began:.1f}s later (child "
                        f"{soak.code_server_child()}, watch reloads "
                        f"{len(soak.watch.reloads) if soak.watch else 0})")
    elif kind == "code_reload":
        reply = soak.code_client().reload_code(timeout=180)
        soak.wait_code_server()
        fault.detail = f"code server reloaded ({type(reply).__name__})"
    elif kind == "failover":
        fault.detail = failover(soak)
    elif kind == "resnapshot":
        # The connector's offsets lost while writes go on: it snapshots again, and the
        # rows changed or deleted meanwhile must come out right.
        connector = soak.connect.connector
        soak.connect.stop_connector(connector.name)
        time.sleep(rng.uniform(2, 6))
        soak.connect.reset_offsets(connector.name)
        if connector.snapshot_mode == "recovery":
            # `recovery` rebuilds a history at an offset and refuses to start without one
            # ("Could not find existing redo log information"): README, the runbook's 5.
            connector = replace(connector, snapshot_mode="initial")
            soak.connect.reconfigure(connector, running=False)
            soak.connect.connector = connector
        fault.detail = (f"offsets reset; snapshot done and streaming "
                        f"{soak.connect.resume_connector(connector):.1f}s later")
    else:
        raise ValueError(f"unknown fault {kind}")


def failover(soak: Soak) -> str:
    """The runbook's failover (README: Failover, binlog resets and re-snapshots): writes
    stop, the standby catches up and is promoted, the connector is pointed at it, and the
    old primary becomes its replica (the next failover goes back)."""
    old, new = soak.mariadb, soak.standby
    began = time.monotonic()
    if soak.workload is not None:
        soak.workload.writing.clear()
    try:
        old.demote()
        new.wait_replicated(old)
        new.promote()
        soak.mariadb, soak.standby = new, old
        soak.switches += 1
        # Debezium before 3.5.2 (debezium#1672) compares MariaDB GTIDs with their server
        # id: once the new primary commits, an offset of the old one reads as purged, and
        # a schema history of another server's GTIDs does not recover. So writes resume
        # after the connector follows, and from the second switch on it runs in
        # `recovery` mode for good (README: the runbook's steps 1 and 2).
        connector = DebeziumConnector.for_server(
            new, topic_prefix=DATABASE,
            snapshot_mode="initial" if soak.switches == 1 else "recovery")
        streaming = soak.connect.reconfigure(connector)
        soak.connect.connector = connector  # what a Connect restart starts from
    finally:
        if soak.workload is not None:
            soak.workload.writing.set()
    old.replicate_from(new, fresh=False)
    old.wait_replicated(new)
    return (f"server {new.server_id} promoted (binlog {new.binlog_position()[0]}), the "
            f"connector streaming from it {streaming:.1f}s later; server {old.server_id} "
            f"its replica; {time.monotonic() - began:.1f}s in all")


# --- measures ---------------------------------------------------------------------------

def _proc_status(pid: int) -> dict[str, int] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss = next(int(line.split()[1]) for line in status.splitlines()
               if line.startswith("VmRSS:"))
    return {"pid": pid, "rss_kb": rss, "fds": fds}


def _du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def measure(soak: Soak) -> dict[str, Any]:
    """RSS and open files of the long-lived processes; disk of the lakehouse and the
    instance; the changelog's files; the event log's rows and bytes."""
    procs: dict[str, Any] = {}
    for name, pid in (("broker", soak.broker.running_pid()),
                      ("connect", soak.connect.running_pid()),
                      ("mariadb", soak.mariadb.running_pid()),
                      ("spark_connect", soak.spark.running_pid()),
                      ("postgres", soak.postgres.running_pid()),
                      ("redis", soak.redis.running_pid()),
                      ("daemon", soak.daemon.pid if soak.daemon else None),
                      ("code_server", soak.code_server.pid if soak.code_server else None)):
        if pid is not None and (status := _proc_status(pid)):
            procs[name] = status
    for job, name in ((CHANGELOG_FOLLOW_JOB_NAME, "changelog_follower"),
                      (FOLLOW_JOB_NAME, "replica_follower")):
        for run in soak.running(job)[:1]:
            for pid in soak.run_pids(run.run_id)[:1]:
                if status := _proc_status(pid):
                    procs[name] = {**status, "run": run.run_id[:8]}
    changelog = Path(changelog_uri(soak.pipeline).removeprefix("file://"))
    with contextlib.closing(soak.postgres.connect("dagster")) as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*), pg_total_relation_size('event_logs') FROM event_logs")
        rows, size = cur.fetchone()
        cur.execute("SELECT pg_database_size('dagster')")
        (db_size,) = cur.fetchone()
    return {
        "at": time.time(), "processes": procs,
        "lakehouse_bytes": _du(soak.work / "lakehouse"),
        "changelog_files": sum(1 for p in changelog.rglob("*.parquet")),
        # The files of its current version (those on disk stay until VACUUM's retention).
        "changelog_live_files":
            # None before the changelog's first commit (the brief variant measures early).
            DeltaTable(str(changelog)).get_add_actions(flatten=True).num_rows
            if (changelog / "_delta_log").is_dir() else None,
        "changelog_log_files": sum(1 for _ in (changelog / "_delta_log").glob("*")),
        "instance_db_bytes": db_size, "postgres_dir_bytes": _du(soak.postgres.data_dir),
        "event_log_rows": rows, "event_log_bytes": size,
    }


def changelog_bound(soak: Soak) -> dict[str, Any]:
    """The changelog's live files against what maintenance leaves them at: the files the
    last compaction (an OPTIMIZE commit) added, plus every file committed after the
    version it read (the rows written while and after it ran). Without maintenance every
    commit's file stays live (405 after 90 s of workload over 20 tables), so the live
    count grows with the commits; with it, it stays below this bound."""
    changelog = Path(changelog_uri(soak.pipeline).removeprefix("file://"))
    live = DeltaTable(str(changelog)).get_add_actions(flatten=True).num_rows
    adds: dict[int, int] = {}
    optimize: tuple[int, int] | None = None  # (version, the version it read)
    for path in sorted((changelog / "_delta_log").glob("*.json")):
        version, added = int(path.stem), 0
        for line in path.read_text().splitlines():
            action = json.loads(line)
            added += "add" in action
            info = action.get("commitInfo") or {}
            if info.get("operation") == "OPTIMIZE":
                read = info.get("readVersion")
                optimize = (version, version - 1 if read is None else int(read))
        adds[version] = added
    if optimize is None:
        return {"live_files": live, "bound": None, "written": sum(adds.values())}
    version, read = optimize
    since = sum(n for v, n in adds.items() if v > read and v != version)
    return {"live_files": live, "bound": adds[version] + since,
            "compaction_left": adds[version], "written_since": since,
            "optimize_version": version, "versions": max(adds) + 1,
            "written": sum(adds.values())}


# --- checks -----------------------------------------------------------------------------

def source_rows(soak: Soak, table: str) -> dict[Any, dict[str, Any]]:
    import pymysql.cursors

    with soak.mariadb.connect(cursorclass=pymysql.cursors.DictCursor) as conn, \
            conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {DATABASE}.{table}")
        return {r["id"]: r for r in cur.fetchall()}


def replica_rows(soak: Soak, table: str, columns: list[str]) -> dict[Any, dict[str, Any]]:
    """The replica's live rows by delta-rs and the README's filter (`_op` not a delete)."""
    uri = table_uri(soak.pipeline, table)
    if not DeltaTable.is_deltatable(uri):
        return {}
    rows = DeltaTable(uri).to_pyarrow_table().to_pylist()
    return {r["id"]: {c: r.get(c) for c in columns} for r in rows if r["_op"] in LIVE_OPS}


def compare_replicas(soak: Soak) -> dict[str, Any]:
    compared, mismatched = 0, {}
    for name in soak.names:
        source = source_rows(soak, name)
        columns = list(next(iter(source.values())).keys()) if source else ["id"]
        replica = replica_rows(soak, name, columns)
        compared += len(source)
        if source != replica:
            diff = [k for k in set(source) | set(replica) if source.get(k) != replica.get(k)]
            mismatched[name] = {"source": len(source), "replica": len(replica),
                                "keys": sorted(diff, key=str)[:10]}
    return {"rows_compared": compared, "mismatched": mismatched}


def compare_cache(soak: Soak) -> dict[str, Any]:
    source = {str(k): {c: cell_text(v) for c, v in row.items() if v is not None}
              for k, row in source_rows(soak, "t0").items()}
    cached = cache.rows_at(soak.redis.url)
    diff = [k for k in set(source) | set(cached) if source.get(k) != cached.get(k)]
    return {"rows": len(source), "cached": len(cached), "mismatches": len(diff),
            "keys": sorted(diff)[:10]}


def wait_drained(soak: Soak, timeout: float) -> dict[str, Any]:
    """The topics' end offsets once Debezium stopped publishing, then every partition's
    committed offset at its end, then the replicas and the cache equal to their tables;
    each wait's seconds. A wait that times out is reported, and the checks fail."""
    began = time.monotonic()
    out: dict[str, Any] = {}
    ends = wait_for_debezium(soak.kafka_conf, soak.topics, timeout=timeout,
                             fence=DebeziumFence(soak.connect, soak.mariadb))
    out["ends"] = ends
    out["published_s"] = round(time.monotonic() - began, 1)
    lag = soak.drained(ends)
    while any(lag.values()) and time.monotonic() - began < timeout:
        soak.sleep(2)
        lag = soak.drained(ends)
    out["lag"] = {k: v for k, v in lag.items() if v}
    out["committed_s"] = round(time.monotonic() - began, 1)
    replicas = compare_replicas(soak)
    cached = compare_cache(soak)
    while (replicas["mismatched"] or cached["mismatches"]) and \
            time.monotonic() - began < timeout:
        soak.sleep(5)
        replicas, cached = compare_replicas(soak), compare_cache(soak)
    out["replicas"], out["cache"] = replicas, cached
    out["converged_s"] = round(time.monotonic() - began, 1)
    return out


def run_summary(soak: Soak) -> dict[str, Any]:
    with soak.instance() as instance:
        records = instance.get_run_records(dg.RunsFilter(created_after=None))
        by = Counter((r.dagster_run.job_name, r.dagster_run.status.value) for r in records)
        left = [r.dagster_run.run_id for r in records if r.dagster_run.status in RUNNING]
    return {"runs": {f"{job} {status}": n for (job, status), n in sorted(by.items())},
            "left_running": left}


def fault_evidence(soak: Soak, faults: list[Fault], window: float = 180.0) -> None:
    """Each fault's traces in the instance: failed runs and warnings or errors logged by
    runs from the fault's start to `window` seconds after its end or the next fault's
    start, whichever is first (the kills: the killed run's own status and failure)."""
    with contextlib.closing(soak.postgres.connect("dagster")) as conn, conn.cursor() as cur:
        for fault, after in zip(faults, [*faults[1:], None], strict=True):
            if fault.skipped:
                continue
            until = fault.ended + window
            if after is not None and after.began and fault.kind not in LATE_EVIDENCE:
                until = min(until, after.began)
            cur.execute(
                "SELECT run_id, dagster_event_type, event FROM event_logs WHERE "
                "timestamp BETWEEN (to_timestamp(%s) AT TIME ZONE 'UTC') AND "
                "(to_timestamp(%s) AT TIME ZONE 'UTC') AND (dagster_event_type IN "
                "('RUN_FAILURE', 'STEP_FAILURE', 'ENGINE_EVENT', 'RUN_CANCELED') OR "
                "(dagster_event_type IS NULL AND event ~ '\"level\": [34]0')) "
                "ORDER BY id",
                (fault.began, until))
            for run_id, event_type, body in cur.fetchall():
                message = failure_cause(body) or json.loads(body).get("user_message") or ""
                if event_type == "ENGINE_EVENT" and not any(
                        w in message.lower() for w in ("fail", "kill", "no longer",
                                                       "lost", "terminat", "crash")):
                    continue
                if fault.target and run_id != fault.target and event_type == "ENGINE_EVENT":
                    continue
                fault.visible.append(f"{run_id[:8]} {event_type or 'LOG'}: "
                                     f"{message[:200]}")


def failure_cause(body: str) -> str | None:
    """A failure event's error (its message and the cause chain's), which the event's
    own message ("Execution of step ... failed.") leaves out."""
    from dagster._core.events.log import EventLogEntry
    from dagster._serdes import deserialize_value

    with contextlib.suppress(Exception):
        event = deserialize_value(body, EventLogEntry).dagster_event
        error = getattr(event.event_specific_data, "error", None) if event else None
        parts = []
        while error is not None and len(parts) < 3:
            parts.append(error.message.strip().splitlines()[0] if error.message else
                         error.cls_name or "")
            error = error.cause
        return " <- ".join(p for p in parts if p) or None
    return None


def seen(fault: dict[str, Any]) -> list[str]:
    """The evidence lines that name the fault (EVIDENCE), of those `fault_evidence`
    collected in its window."""
    pattern = EVIDENCE.get(fault["kind"])
    return [line for line in fault["visible"] if pattern and re.search(pattern, line)]


def duplicates(soak: Soak, faults: list[Fault]) -> dict[str, Any]:
    """Handler calls beyond the first per event, each attributed to the last fault that
    struck between the event's first call and the repeat ('none' if no fault did): a
    kill strikes when its signal goes, after it waited for a run to kill."""
    calls, first, repeats = read_calls(soak.redis.url)
    done = sorted((f.struck or f.began, i) for i, f in enumerate(faults) if not f.skipped)
    per_fault: Counter = Counter()
    per_kind: Counter = Counter()
    unexplained: list[dict] = []
    same_process = 0
    for repeat in repeats:
        t0 = first[repeat["coord"]]["t"]
        same_process += repeat["pid"] == first[repeat["coord"]]["pid"]
        cause = [i for began, i in done if t0 - 5 <= began <= repeat["t"]]
        if cause:
            per_fault[cause[-1]] += 1
            per_kind[faults[cause[-1]].kind] += 1
        else:
            unexplained.append({**repeat, "first": first[repeat["coord"]],
                                "event": parse_coordinate(repeat["coord"])})
    return {"events_handled": len(calls), "calls": sum(calls.values()),
            "repeats": len(repeats), "same_process": same_process,
            "by_kind": dict(per_kind),
            "by_fault": {f"{i} {faults[i].kind}": n for i, n in sorted(per_fault.items())},
            "unexplained": len(unexplained), "unexplained_first": unexplained[:10]}


# --- the run ----------------------------------------------------------------------------

def soak(minutes: float, seed: int, tables: int, kinds: list[str], repeats: int,
         rate: float, work: Path, drain_timeout: float,
         maintenance_every: float = 300.0, wait_built: bool = True) -> dict[str, Any]:
    """`wait_built` False: the workload starts as soon as the stack is up, while the
    first build of the replicas runs (the brief variant's minutes)."""
    seconds = minutes * 60
    stack = Soak(work, tables=tables, seed=seed)
    report: dict[str, Any] = {"minutes": minutes, "seed": seed, "tables": tables,
                              "rate": rate, "work": str(work),
                              "load_at_start": os.getloadavg()}
    began = time.time()
    maintenance: Maintenance | None = None
    try:
        stack.start()
        report["startup"] = dict(stack.timings)
        report["started_s"] = round(time.time() - began, 1)
        with stack.instance() as instance:
            deadline = time.monotonic() + drain_timeout
            missing = list(stack.names) if wait_built else []
            while missing and time.monotonic() < deadline:
                missing = [n for n in missing if not instance.fetch_materializations(
                    dg.AssetKey(["replica", n]), limit=1).records]
                time.sleep(2)
        if missing:
            raise TimeoutError(f"replicas not built: {missing}")
        if wait_built:
            report["built_s"] = round(time.time() - began, 1)
            report["startup"]["first_build"] = round(report["built_s"] - report["started_s"],
                                                     1)
            log(f"{tables} replicas built {report['built_s']}s after the start "
                f"({report['startup']})")
        else:
            report["built_s"] = None
        report["start"] = measure(stack)
        faults = schedule(kinds, repeats, seconds, seed)
        workload = Workload(lambda: stack.mariadb, stack.broker.bootstrap_servers, tables,
                            rate, seconds, seed, malformed_every=max(5.0, seconds / 20))
        stack.workload = workload
        rng = random.Random(seed + 1)
        replicas = stack.names[:4]
        progress = Progress({"changelog": changelog_uri(stack.pipeline),
                             **{n: table_uri(stack.pipeline, n) for n in replicas}})
        progress.start()
        # `maintenance_every` 0: no maintenance (the quick variant's 2 minutes).
        maintenance = Maintenance(stack, maintenance_every) if maintenance_every > 0 else None
        workload.start()
        if maintenance is not None:
            maintenance.start()
        load_began = time.monotonic()
        for fault in faults:
            wait = fault.planned - (time.monotonic() - load_began)
            if wait > 0:
                stack.sleep(wait)
            fault.began = time.time()
            log(f"fault {fault.kind}")
            try:
                inject(stack, fault, rng)
            except Exception as e:
                fault.detail = f"injection failed: {type(e).__name__}: {e}"
            fault.ended = time.time()
            log(f"  {fault.detail} ({fault.ended - fault.began:.1f}s)")
        rest = seconds - (time.monotonic() - load_began)
        if rest > 0:
            stack.sleep(rest)
        workload.finish()
        report["workload_s"] = round(time.monotonic() - load_began, 1)
        report["statements"] = dict(workload.ops)
        report["statements_failed"] = workload.failed
        report["specials"] = [kind for _t, kind in workload.specials_done]
        log(f"workload stopped: {dict(workload.ops)}, {workload.failed} failed")
        # The last maintenance run ends before the drain, whose checks then see the
        # tables as maintenance left them (its commits are changelog and replica versions
        # the followers go on from).
        report["maintenance"] = (maintenance.finish(drain_timeout) if maintenance is not None
                                 else {"runs": [], "off": True, "every_s": 0,
                                       "skipped_turns": 0})
        maintenance = None
        log(f"maintenance: {report['maintenance']}; draining")
        report["drain"] = wait_drained(stack, drain_timeout)
        log(f"drained in {report['drain']['converged_s']}s")
        report["changelog_bound"] = changelog_bound(stack)
        progress.stop.set()
        for fault in faults:
            fault.recovered_changelog_s = progress.first_commit_after(fault.ended,
                                                                      ["changelog"])
            fault.recovered_replicas_s = progress.first_commit_after(fault.ended, replicas)
        report["changelog_rows"] = DeltaTable(
            changelog_uri(stack.pipeline)).to_pyarrow_dataset().count_rows()
        report["end"] = measure(stack)
        report["events"] = sum(report["drain"]["ends"].values())
        got = dead_letter_coordinates(stack.kafka_conf, DLQ)
        sent = Counter(workload.malformed)
        report["dead_letters"] = {
            "sent": len(sent), "lost_before_ack": workload.malformed_lost,
            "in_topic": sum(got.values()),
            "missing": sorted(set(sent) - set(got)),
            "unexpected": sorted(set(got) - set(sent))[:20],
            "repeats": sum(n - 1 for n in got.values() if n > 1)}
        report["duplicates"] = duplicates(stack, faults)
        # Drained, only the two followers may be in progress (each its one STARTED run);
        # then, the daemon stopped and the runs terminated as the UI does, none.
        in_progress = run_summary(stack)["left_running"]
        followers = [r.run_id for job in (CHANGELOG_FOLLOW_JOB_NAME, FOLLOW_JOB_NAME)
                     for r in stack.running(job)[:1]]
        stack.stop_daemon()
        terminate_runs(60.0)
        report["runs"] = run_summary(stack)
        report["runs"]["followers_at_end"] = followers
        report["runs"]["stuck_at_end"] = [r for r in in_progress if r not in followers]
        with stack.instance() as instance:
            for fault in faults:
                if fault.target:
                    record = instance.get_run_record_by_id(fault.target)
                    fault.visible.insert(0, f"killed run {fault.target[:8]}: "
                                            f"{record.dagster_run.status.value}")
        fault_evidence(stack, faults)
        report["faults"] = [vars(f) for f in faults]
        report["faults_unseen"] = unseen_faults(report["faults"])
        report["faults_not_visible_in_dagster"] = [
            f"{i} {f.kind}" for i, f in enumerate(faults)
            if not f.skipped and not seen_by(vars(f))]
    except Exception:
        report["error"] = traceback.format_exc()
        log(report["error"])
    finally:
        if maintenance is not None:
            maintenance.stop.set()
        report["seconds"] = round(time.time() - began, 1)
        report["load_at_end"] = os.getloadavg()
        report["code_watch_reloads"] = stack.watch.reloads if stack.watch else []
        stack.stop()
    report["checks"] = checks(report)
    return report


def checks(report: dict[str, Any]) -> dict[str, bool]:
    if "error" in report:
        return {"completed": False}
    drain, dups = report["drain"], report["duplicates"]
    faults, bound = report["faults"], report["changelog_bound"]
    return {
        "replicas_equal": not drain["replicas"]["mismatched"],
        "cache_equal": drain["cache"]["mismatches"] == 0,
        "dead_letters_complete": not report["dead_letters"]["missing"]
        and not report["dead_letters"]["unexpected"] and report["dead_letters"]["sent"] > 0,
        "lag_zero": not drain["lag"],
        "no_run_left_running": not report["runs"]["left_running"]
        and not report["runs"]["stuck_at_end"],
        "no_repeat_without_fault": dups["unexplained"] == 0,
        "killed_runs_failed": all(f["visible"] and f["visible"][0].endswith(": FAILURE")
                                  for f in faults if f["target"]),
        "every_fault_injected": all(not f["skipped"] and "injection failed" not in f["detail"]
                                    for f in faults),
        "faults_visible": not unseen_faults(faults),
    } | ({} if report["maintenance"].get("off") else {
        "maintenance_ran": bool(runs := report["maintenance"]["runs"])
        and all(r["status"] == "SUCCESS" for r in runs),
        "changelog_files_bounded": bound["bound"] is not None
        and bound["live_files"] <= bound["bound"],
    })


def unseen_faults(faults: list[dict[str, Any]]) -> list[str]:
    """The injected faults of a kind Dagster can see with no evidence in the instance
    (`fault_evidence`: the killed run's failure, a failed run, or a run's warning or
    error naming it); the kinds it cannot see (NOT_VISIBLE) are listed in the report."""
    return [f"{i} {f['kind']}" for i, f in enumerate(faults)
            if not f["skipped"] and seen_by(f) and not seen(f)]


def seen_by(fault: dict[str, Any]) -> bool:
    """Whether a run could see the fault: not of a kind none can (NOT_VISIBLE), and for a
    Spark Connect restart, one that met a run using Spark (none may run then: a follower
    killed just before, the next one queued behind the server's start)."""
    if fault["kind"] in NOT_VISIBLE:
        return False
    return fault["kind"] != "spark_restart" or bool(fault["exposed"])


def markdown(report: dict[str, Any]) -> str:
    kinds = Counter(f["kind"] for f in report["faults"] if not f["skipped"])
    dups = report["duplicates"]
    lines = [
        f"# Soak, seed {report['seed']}: {report['minutes']} min of workload, "
        f"{report['tables']} tables",
        "",
        f"- total {report['seconds']} s; replicas built {report.get('built_s')} s; drained "
        f"{report['drain']['converged_s']} s after the workload stopped",
        f"- statements {report['statements']} ({report['statements_failed']} failed while "
        f"MariaDB was down); Kafka records {report['events']}, changelog rows "
        f"{report['changelog_rows']}",
        f"- faults: {dict(kinds)}",
        f"- replicas: {report['drain']['replicas']['rows_compared']} rows compared, "
        f"mismatched {report['drain']['replicas']['mismatched'] or 0}; cache "
        f"{report['drain']['cache']}",
        f"- dead letters: {report['dead_letters']}",
        f"- handler calls {dups['calls']} for {dups['events_handled']} events: repeats "
        f"{dups['repeats']} by fault kind {dups['by_kind']}, unexplained "
        f"{dups['unexplained']}, in the same process {dups['same_process']}",
        f"- runs: {report['runs']}",
        f"- start (s, load {report['load_at_start']}): {report['startup']}; stack up "
        f"{report['started_s']} s",
        "- maintenance every {every_s} s: {n} runs {statuses}, changelog files (before, "
        "after) per compaction {files}; skipped turns {skipped}".format(
            n=len(report["maintenance"]["runs"]), every_s=report["maintenance"]["every_s"],
            statuses=[(r["status"], f"queued {r['queued_s']} s", f"ran {r['ran_s']} s")
                      for r in report["maintenance"]["runs"]],
            files=[r["changelog_files"] for r in report["maintenance"]["runs"]],
            skipped=report["maintenance"]["skipped_turns"]),
        f"- changelog live files at the end {report['changelog_bound']}",
        f"- code location reloads by the watch: {report['code_watch_reloads']}",
        f"- faults not visible in Dagster (by kind): "
        f"{report['faults_not_visible_in_dagster']}; visible kinds without evidence: "
        f"{report['faults_unseen']}",
        "",
        "| # | fault | at | s | detail | next changelog / replica commit s | seen in Dagster |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, f in enumerate(report["faults"]):
        named = seen(f) or (["not visible in Dagster"] if f["kind"] in NOT_VISIBLE else [])
        shown = "; ".join(named[:3]).replace("|", "/").replace("\n", " ")
        lines.append(f"| {i} | {f['kind']} | {time.strftime('%H:%M:%S', time.gmtime(f['began']))}"
                     f" | {f['ended'] - f['began']:.1f} | {f['detail']} | "
                     f"{f['recovered_changelog_s']} / {f['recovered_replicas_s']} | "
                     f"{shown or '-'} |")
    lines += ["", "| measure | start | end |", "| --- | --- | --- |"]
    start, end = report["start"], report["end"]
    for key in ("lakehouse_bytes", "changelog_files", "changelog_live_files",
                "changelog_log_files",
                "instance_db_bytes", "postgres_dir_bytes", "event_log_rows", "event_log_bytes"):
        lines.append(f"| {key} | {start[key]} | {end[key]} |")
    for name in sorted(set(start["processes"]) | set(end["processes"])):
        a, b = start["processes"].get(name, {}), end["processes"].get(name, {})
        lines.append(f"| {name} RSS kB / fds | {a.get('rss_kb')} / {a.get('fds')} | "
                     f"{b.get('rss_kb')} / {b.get('fds')} |")
    lines += ["", f"checks: {report['checks']}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tables", type=int, default=20)
    parser.add_argument("--rate", type=float, default=10.0, help="statements a second")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"kinds, comma-separated (of {', '.join(FAULTS)})")
    parser.add_argument("--repeats", type=int, default=2, help="faults of each kind")
    parser.add_argument("--drain-timeout", type=float, default=900.0)
    parser.add_argument("--maintenance-every", type=float, default=300.0,
                        help="seconds between runs of lakehouse_maintenance_job")
    parser.add_argument("--report", type=Path, default=ROOT / "var" / "soak")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    kinds = [k for k in args.faults.split(",") if k]
    if unknown := set(kinds) - set(FAULTS):
        parser.error(f"unknown faults: {sorted(unknown)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="binlake-soak-"))
    report = soak(args.minutes, args.seed, args.tables, kinds, args.repeats, args.rate,
                  work, args.drain_timeout, args.maintenance_every)
    args.report.mkdir(parents=True, exist_ok=True)
    (args.report / "report.json").write_text(json.dumps(report, indent=1, default=str))
    if "error" not in report:
        (args.report / "report.md").write_text(markdown(report))
        print(markdown(report))
    if not args.keep and all(report["checks"].values()):
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"(logs and data in {work})")
    return 0 if all(report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
