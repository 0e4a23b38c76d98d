"""The local stack's Spark Connect server: one warm Spark (with Delta and the catalog) for
every replica build and dbt run, instead of a JVM started by each run.

It is PySpark's own `SparkConnectServer`, launched through the `spark-submit` that ships
in the pyspark package, with binlake's `spark_conf` (Delta's jars and extensions, the
warehouse, the embedded Derby catalog). It holds the lakehouse's catalog lock for its
whole life, handed down as an open descriptor, so a Spark started in some other process
on the same lakehouse waits instead of breaking Derby.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from binlog_assets.config import PipelineConfig
from binlog_assets.dev.process import LocalDaemon, port_open
from binlog_assets.lakehouse.spark import lock_catalog, spark_conf, uses_embedded_catalog

_SERVER_MAIN = "org.apache.spark.sql.connect.service.SparkConnectServer"
PORT_RELEASE_SECONDS = 120.0
# A catalog query and a small Delta round trip like a replica build's (a table with the
# replicas' features, an append, a MERGE, the change feed, the history), on a scratch
# path: the first run then meets loaded classes and compiled code, not a cold JVM.
_WARM_UP = """
import shutil, sys
from pyspark.sql.connect.session import SparkSession
session = SparkSession.builder.remote(sys.argv[1]).create()
session.sql("SHOW DATABASES").collect()
path = sys.argv[2]
table = f"delta.`{path}`"
session.sql(f"CREATE TABLE {table} (id BIGINT, v STRING, p STRUCT<f: INT, o: BIGINT>) "
            "USING DELTA TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
            "'delta.enableDeletionVectors' = 'true', 'delta.enableTypeWidening' = 'true', "
            "'delta.enableChangeDataFeed' = 'true')")
rows = "SELECT id, CAST(id AS STRING) AS v, named_struct('f', 1, 'o', id) AS p FROM range(200)"
session.sql(f"INSERT INTO {table} {rows}")
session.sql(f"MERGE INTO {table} t USING ({rows} WHERE id % 3 = 0) s ON t.id = s.id "
            "WHEN MATCHED AND s.p > t.p THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT * "
            "WHEN NOT MATCHED BY SOURCE AND t.id > 190 THEN DELETE")
(session.read.format("delta").option("readChangeFeed", "true")
 .option("startingVersion", 1).load(path).groupBy("_change_type").count().collect())
session.sql(f"DESCRIBE HISTORY {table} LIMIT 1").collect()
session.stop()
shutil.rmtree(path, ignore_errors=True)
"""


@dataclass
class SparkConnectServer(LocalDaemon):
    """A Spark Connect server on `127.0.0.1:port` whose scratch and logs are in `data_dir`.

    `start()` is idempotent like the broker's: a server already running from the same
    directory is reused. `lake` is the local lakehouse whose catalog it locks (None for
    one on object storage or with its own metastore).
    """

    stem: ClassVar[str] = "spark-connect"

    data_dir: Path
    port: int | None = None
    conf: Mapping[str, str] = field(default_factory=dict)
    lake: Path | None = None

    @classmethod
    def for_config(cls, pipeline: PipelineConfig, data_dir: Path) -> SparkConnectServer:
        """The server `pipeline.spark.remote` names, when that is a port on this machine."""
        port = pipeline.spark.remote_port
        if port is None:
            raise ValueError(f"spark.remote={pipeline.spark.remote!r} is not a local "
                             "sc://127.0.0.1:<port> server the stack can start")
        # The catalog lock is this server's, not the client's: ask as if in-process.
        in_process = pipeline.model_copy(update={
            "spark": pipeline.spark.model_copy(update={"remote": None})})
        lake = (pipeline.lakehouse.resolved_path() if uses_embedded_catalog(in_process)
                else None)
        return cls(data_dir, port, spark_conf(in_process), lake)

    def _marker(self) -> Path:
        return self.data_dir

    def start(self, timeout: float = 180.0) -> float:
        """Start (or reuse) the server; returns the seconds until it answered a query."""
        began = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.port is None:
            raise ValueError("a Spark Connect server needs its port")
        if self._reuse_port():
            self._wait_ready(None, began, timeout)
            return time.monotonic() - began
        if port_open(self.port):
            raise RuntimeError(f"port {self.port} is taken by another process: "
                               "spark.remote must name a free port for the local server")
        lock = lock_catalog(self.lake, timeout) if self.lake is not None else None
        try:
            self._launch(self._command(), "spark-connect.stdout",
                         lambda proc: self._wait_ready(proc, began, timeout),
                         pass_fds=() if lock is None else (lock,))
        finally:
            if lock is not None:
                os.close(lock)  # the server holds its inherited copy
        return time.monotonic() - began

    def stop(self, timeout: float | None = None) -> None:
        """Stop the server and wait for its port to be free: the port has been seen still
        listening after the process was gone, and a restart then refused it."""
        super().stop(timeout)
        if self.port is None:
            return
        deadline = time.monotonic() + PORT_RELEASE_SECONDS
        while port_open(self.port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"port {self.port} still listens {PORT_RELEASE_SECONDS:.0f}"
                                   " s after the Spark Connect server stopped")
            time.sleep(0.2)

    def status(self) -> str:
        pid = self.running_pid()
        if pid is None:
            return f"spark-connect: stopped (data in {self.data_dir})"
        return f"spark-connect: running pid={pid} remote=sc://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        import pyspark

        spark_home = Path(pyspark.__file__).parent
        conf = {
            **self.conf,
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            # Scratch space in the data directory, which also marks the process as ours.
            "spark.local.dir": str(self.data_dir / "tmp"),
        }
        memory = conf.pop("spark.driver.memory", "2g")
        args = [str(spark_home / "bin" / "spark-submit"), "--class", _SERVER_MAIN,
                "--name", "binlake-connect", "--driver-memory", memory]
        for k, v in conf.items():
            args += ["--conf", f"{k}={v}"]
        return [*args, "spark-internal"]

    def _launch_env(self) -> dict[str, str]:
        import pyspark

        return {**os.environ, "SPARK_HOME": str(Path(pyspark.__file__).parent),
                "PYSPARK_PYTHON": sys.executable}

    def _wait_ready(self, proc: subprocess.Popen[bytes] | None, began: float,
                    timeout: float) -> None:
        """Wait for the gRPC port, then for the warm-up's queries to be answered."""
        deadline = began + timeout
        while not port_open(self.port):
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"spark connect server exited with {proc.returncode}:\n"
                                   f"{self._log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"spark connect server not listening on {self.port} after "
                                   f"{timeout:.0f}s:\n{self._log_tail()}")
            time.sleep(0.25)
        # In a child: a Connect client switches its whole process to Connect columns
        # (`SPARK_CONNECT_MODE_ENABLED`), which the caller may not want.
        warm = subprocess.run(
            [sys.executable, "-c", _WARM_UP, f"sc://127.0.0.1:{self.port}",
             str(self.data_dir / "warm-up")],
            capture_output=True, text=True, timeout=max(deadline - time.monotonic(), 10))
        if warm.returncode != 0:
            raise RuntimeError(f"spark connect server did not answer a query:\n"
                               f"{warm.stderr[-2000:]}\n{self._log_tail()}")

    def _log_tail(self) -> str:
        path = self.data_dir / "spark-connect.stdout"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""
