"""The SparkSession binlake builds: local by default, Delta Lake on, catalog in the lakehouse.

Delta's jars come from `.cache/jars/delta` (resolved by Maven at set-up) and are passed
as local `spark.jars`, so a run never downloads anything. The warehouse and a Hive
catalog (embedded Derby) live under the lakehouse path, which is what lets dbt-spark
(`method: session`) and the replica builds see the same tables. A user with a cluster
sets `spark.master` and an `s3a://` lakehouse path; every `spark.conf` key overrides ours.

With `spark.remote` set, every Spark step is a Spark Connect client of that server: the
server (started with `spark_conf`, which the local stack does for a loopback address)
holds the JVM, the catalog and Delta, warm across runs, and a run's process only speaks
gRPC to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

from binlog_assets.config import PipelineConfig
from binlog_assets.environment import cache_dir, jars_dir
from binlog_assets.lakehouse.spark_waits import note_retries

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# A driver's builds are short: C2's compiling took more CPU than it saved (RESULTS.md,
# "The driver's JIT"), and on few cores it competes with the build itself. C1 alone gets a
# 48 MB code cache by default, which 50 applies filled (the JIT then stops for good):
# the tiered default's size instead.
C1_ONLY = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


# The driver class-data archive (built by `binlog_assets/dev/class_archive.py`): where it
# lives, and the JVM options that map it. Without QUIET, a driver whose class path differs
# from the archive's (an `s3a://` lakehouse adds jars) prints a page of warnings first.
ARCHIVE_DIR = "spark-cds"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _java() -> str:
    """The `java` that spark-submit runs: JAVA_HOME's, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return os.path.realpath(found) if found else "java"


def archive_file() -> Path:
    """Where the class archive for this JDK, PySpark and Delta is (or would be): its name
    is a key of the three, so an upgrade looks for a new one."""
    try:
        delta = sorted(p.name for p in jars_dir("delta").glob("*.jar"))
    except FileNotFoundError:
        delta = []
    key = json.dumps([_java(), version("pyspark"), delta])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / ARCHIVE_DIR / f"driver-{digest}.jsa"


def archive_java_options() -> str:
    """The driver JVM options that map the class archive; empty when there is none."""
    path = archive_file()
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path.is_file() else ""


def delta_jars() -> list[str]:
    return sorted(str(p) for p in jars_dir("delta").glob("*.jar"))


def s3_jars() -> list[str]:
    return sorted(str(p) for p in jars_dir("s3").glob("*.jar"))


def _s3a_conf() -> dict[str, str]:
    """Hadoop's S3A filesystem for an `s3a://` lakehouse: on the class path (not in
    `spark.jars`, which would copy its 690 MB AWS SDK into every session), pointed at the
    endpoint and region the environment names; credentials come from the environment
    too (the AWS SDK's default chain)."""
    classpath = ":".join(s3_jars())
    conf = {"spark.driver.extraClassPath": classpath,
            "spark.executor.extraClassPath": classpath}
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        # An S3-compatible store (moto, MinIO) serves buckets by path, not by host name.
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
            endpoint.startswith("https:")).lower()
    if region := os.environ.get("AWS_REGION"):
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    return conf


def spark_conf(pipeline: PipelineConfig) -> dict[str, str]:
    """Every Spark setting binlake needs, with the user's `spark.conf` applied last."""
    local = pipeline.lakehouse.is_local
    conf = {
        "spark.master": pipeline.spark.master,
        "spark.app.name": "binlake",
        "spark.jars": ",".join(delta_jars()),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.warehouse.dir": pipeline.lakehouse.uri("warehouse"),
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "4",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Delta's default of 50 snapshot partitions is for clusters; locally it is most
        # of the time a small table read takes.
        "spark.databricks.delta.snapshotPartitions": "2",
        # VACUUM lists a table's files in this many tasks (Spark's default: 10,000, a
        # cluster's): locally that was minutes of task overhead per table.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": "2g",
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        "spark.sql.ansi.enabled": "true",
        # PySpark's capture of the Python call site for every DataFrame and function call
        # (a stack walk and three JVM round trips each): about half the driver time of
        # building a small apply's plan. Errors still name the failing expression.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
    }
    # The driver maps the class archive `make setup` made, when there is one: seconds
    # off its start and its first build (`binlog_assets/dev/class_archive.py`).
    java_options = [archive_java_options()] if pipeline.spark.class_archive else []
    if pipeline.spark.driver_jit == "c1":
        java_options.append(C1_ONLY)
    if local:
        # Embedded Derby admits one JVM at a time; its files stay with the lakehouse.
        lake = pipeline.lakehouse.resolved_path()
        conf["spark.hadoop.javax.jdo.option.ConnectionURL"] = (
            f"jdbc:derby:;databaseName={lake / 'metastore_db'};create=true"
        )
        java_options.insert(0, f"-Dderby.system.home={lake}")
    elif pipeline.lakehouse.path.startswith("s3a://"):
        conf.update(_s3a_conf())
    if options := " ".join(o for o in java_options if o):
        conf["spark.driver.extraJavaOptions"] = options
    conf.update({k: str(v).lower() if isinstance(v, bool) else str(v)
                 for k, v in pipeline.spark.conf.items()})
    return conf


def get_spark(pipeline: PipelineConfig) -> SparkSession:
    """The process's SparkSession for this config (created once, then reused)."""
    from pyspark.sql import SparkSession

    if pipeline.spark.remote:
        return _remote_session(pipeline.spark.remote)
    conf = spark_conf(pipeline)
    if pipeline.lakehouse.is_local:
        pipeline.lakehouse.resolved_path().mkdir(parents=True, exist_ok=True)
    hold_catalog_lock(pipeline)
    builder = SparkSession.builder
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


# Spark Connect sessions this process opened (url -> session), released at exit.
_REMOTE_SESSIONS: dict[str, SparkSession] = {}


def _remote_session(url: str) -> SparkSession:
    session = _REMOTE_SESSIONS.get(url)
    if session is None:
        session = _REMOTE_SESSIONS[url] = _connect(url, new=False)
    return session


def remote_session_lost(pipeline: PipelineConfig) -> bool:
    """Whether this process's Spark Connect session stopped answering (its server was
    stopped or restarted: the session is gone with it). False without one, or for Spark
    in this process."""
    session = _REMOTE_SESSIONS.get(pipeline.spark.remote or "")
    return session is not None and session_lost(session)


# A probe gets this long: the Connect client retries a call to a server that went away
# for minutes, and whoever asks waits on the answer (a follower's apply, its pool slot).
PROBE_SECONDS = 20.0


def session_lost(session: SparkSession, timeout: float = PROBE_SECONDS) -> bool:
    """Whether `session`, a Spark Connect session, stopped answering: a probe query on it
    fails or is not answered in `timeout` seconds. Always False for a session in this
    process (its JVM is this process's own)."""
    from pyspark.sql import SparkSession as ClassicSparkSession

    if isinstance(session, ClassicSparkSession):
        return False
    answered, failed = threading.Event(), []

    def probe() -> None:
        try:
            session.sql("SELECT 1").collect()
        except Exception as exc:
            failed.append(exc)
        finally:
            answered.set()

    # A thread of its own: a probe still retrying past the deadline is left to end alone.
    threading.Thread(target=probe, name="binlake-spark-probe", daemon=True).start()
    return not answered.wait(timeout) or bool(failed)


def forget_remote_session(pipeline: PipelineConfig) -> None:
    """Drop this process's Spark Connect session: the next `get_spark` opens a new one."""
    session = _REMOTE_SESSIONS.pop(pipeline.spark.remote or "", None)
    if session is not None:
        with contextlib.suppress(Exception):
            session.stop()


# Spark compiles each query's generated Java (whole-stage and expression code) with Janino
# before it runs, once per query shape and JVM: for a small batch of a shape the JVM has
# not seen (a new schema, a fresh run's JVM) compiling is most of the work. From some
# thousands of rows the compiled code pays for itself.
INTERPRETED = (("spark.sql.codegen.wholeStage", "false"),
               ("spark.sql.codegen.factoryMode", "NO_CODEGEN"))
INTERPRET_ROWS = 1_000  # batches of at most this many changelog rows are interpreted


class Evaluation:
    """Switches a session between interpreting its queries (small batches) and Spark's
    compiled code (its own default, or what the user's `spark.conf` set)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.compiled = {key: spark.conf.get(key, None) for key, _ in INTERPRETED}
        self.interpreted = False

    def interpret(self, on: bool) -> None:
        if on == self.interpreted:
            return
        for key, value in INTERPRETED:
            if on:
                self.spark.conf.set(key, value)
            elif self.compiled[key] is None:
                self.spark.conf.unset(key)
            else:
                self.spark.conf.set(key, self.compiled[key])
        self.interpreted = on


def new_session(spark: SparkSession, pipeline: PipelineConfig) -> SparkSession:
    """A session of its own beside `spark` (own SQL settings, the same catalog)."""
    if not pipeline.spark.remote:
        return spark.newSession()
    return _connect(pipeline.spark.remote, new=True)


def _connect(url: str, *, new: bool) -> SparkSession:
    """A Spark Connect session to `url`, released when this process exits."""
    import atexit

    # The Connect class itself: `pyspark.sql.SparkSession.builder.remote` refuses to open
    # one in a process that also runs a classic session (the test suite does).
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    # What `builder.remote` does too: `pyspark.sql.functions` then build Connect columns
    # in this process.
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    builder = RemoteSparkSession.builder.remote(url)
    session = builder.create() if new else builder.getOrCreate()
    note_retries(session.client, url)  # a run can then name a server its calls wait on
    # The server keeps a session's state (temp views, caches) until it is released or
    # idles out; a run's process releases its own as it ends.
    atexit.register(session.stop)
    return session


# Catalog locks this process holds (path -> file descriptor), until it exits.
_CATALOG_LOCKS: dict[str, int] = {}
CATALOG_LOCK_TIMEOUT_SECONDS = 3600.0


def uses_embedded_catalog(pipeline: PipelineConfig) -> bool:
    """A local lakehouse whose Hive catalog is binlake's embedded Derby (not overridden),
    opened by Spark in this process rather than by a Spark Connect server."""
    return (pipeline.lakehouse.is_local and not pipeline.spark.remote
            and "spark.hadoop.javax.jdo.option.ConnectionURL" not in pipeline.spark.conf)


def hold_catalog_lock(pipeline: PipelineConfig,
                      timeout: float = CATALOG_LOCK_TIMEOUT_SECONDS) -> None:
    """Take the local lakehouse's catalog lock for the rest of this process's life.

    Embedded Derby admits one JVM at a time, and a second one fails deep inside Hive
    ("Unable to instantiate SessionHiveMetaStoreClient"). Every process that starts
    Spark (or dbt's Spark) on a local lakehouse takes `<lakehouse>/catalog.lock` first,
    waiting for whoever holds it; the kernel releases it when the process exits, and
    binlake's JVM (a child of the process) goes with it. No-op for a lakehouse on object
    storage, a configured metastore or a Spark Connect server, and when this process
    already holds it.
    """
    import os

    if not uses_embedded_catalog(pipeline):
        return
    lake = pipeline.lakehouse.resolved_path()
    path = str(lake / "catalog.lock")
    if path in _CATALOG_LOCKS:
        return
    fd = lock_catalog(lake, timeout)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _CATALOG_LOCKS[path] = fd


def lock_catalog(lake: Path, timeout: float = CATALOG_LOCK_TIMEOUT_SECONDS) -> int:
    """Lock `<lake>/catalog.lock`, waiting up to `timeout` seconds; returns the locked
    descriptor (the lock lives as long as it, or a child's inherited copy, is open)."""
    import fcntl
    import os
    import time

    lake.mkdir(parents=True, exist_ok=True)
    fd = os.open(lake / "catalog.lock", os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                os.close(fd)
                raise TimeoutError(
                    f"the embedded catalog of {lake} stayed locked by pid {holder or '?'} "
                    f"for {timeout:.0f}s (Derby admits one Spark process at a time)"
                ) from None
            time.sleep(0.5)
    os.ftruncate(fd, 0)
    return fd
