"""A Spark standalone cluster for the local stack: a master and workers, each its own JVM.

They are the PySpark distribution's own `org.apache.spark.deploy.master.Master` and
`...worker.Worker`, launched with its `spark-class`, so the cluster runs exactly the
Spark the client has. A replica build (or dbt) reaches it by configuration only,
`spark.master: spark://127.0.0.1:<port>`: the driver stays in the run's process and
ships Delta's jars (`spark.jars`) to the executors the workers start. The lakehouse is
a local path here, which every executor of this machine reads and writes as the driver
does; on several machines it would be object storage.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from binlog_assets.dev.process import LocalDaemon, free_port, port_open

_MASTER_MAIN = "org.apache.spark.deploy.master.Master"
_WORKER_MAIN = "org.apache.spark.deploy.worker.Worker"


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class _SparkDaemon(LocalDaemon):
    """What the master and the workers share: `spark-class`, their environment, waiting."""

    def _launch_env(self) -> dict[str, str]:
        return {**os.environ, "SPARK_HOME": str(_spark_home()),
                "PYSPARK_PYTHON": sys.executable,
                # Spark's own daemon logs stay in the data dir.
                "SPARK_LOG_DIR": str(self.data_dir), "SPARK_DAEMON_MEMORY": "512m"}

    def _running(self) -> bool:
        """True when an instance from this directory runs (its port read back); else
        the directory exists and `port` is set, for a launch."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._reuse_port():
            return True
        self.port = self.port or free_port()
        return False

    def _spark_class(self, main: str, *args: str) -> list[str]:
        return [str(_spark_home() / "bin" / "spark-class"), main, *args]

    def _wait_port(self, proc: subprocess.Popen[bytes], port: int, began: float,
                   timeout: float, what: str) -> None:
        while not port_open(port):
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() - began > timeout:
                raise TimeoutError(f"{what} not listening on {port} after {timeout:.0f}s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.25)

    def log_tail(self) -> str:
        path = self.data_dir / f"{self.stem}.stdout"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@dataclass
class SparkMaster(_SparkDaemon):
    """The standalone master on `127.0.0.1:port` (its web UI on `webui_port`)."""

    stem: ClassVar[str] = "spark-master"

    data_dir: Path
    port: int | None = None
    webui_port: int | None = None

    def _marker(self) -> Path:
        return self.data_dir

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("spark master not started")
        return f"spark://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> float:
        began = time.monotonic()
        if self._running():
            return time.monotonic() - began
        self.webui_port = self.webui_port or free_port()
        cmd = self._spark_class(_MASTER_MAIN, "--host", "127.0.0.1", "--port", str(self.port),
                                "--webui-port", str(self.webui_port),
                                # The marker: a stale pid file is never taken for ours.
                                "--properties-file", str(self._properties()))
        self._launch(cmd, f"{self.stem}.stdout",
                     lambda p: self._wait_port(p, self.port, began, timeout, "spark master"))
        return time.monotonic() - began

    def _properties(self) -> Path:
        path = self.data_dir / "master.conf"
        path.write_text("spark.master.rest.enabled false\n")
        return path

    def status(self) -> str:
        pid = self.running_pid()
        if pid is None:
            return f"spark-master: stopped (data in {self.data_dir})"
        return f"spark-master: running pid={pid} {self.url}"


@dataclass
class SparkWorker(_SparkDaemon):
    """One worker of `master_url`, offering `cores` and `memory` to executors; the
    executors' scratch and logs are in its data dir."""

    stem: ClassVar[str] = "spark-worker"

    data_dir: Path
    master_url: str = ""
    cores: int = 1
    memory: str = "1536m"
    port: int | None = None

    def _marker(self) -> Path:
        return self.data_dir / "work"

    def start(self, timeout: float = 120.0) -> float:
        began = time.monotonic()
        if self._running():
            return time.monotonic() - began
        cmd = self._spark_class(_WORKER_MAIN, self.master_url, "--host", "127.0.0.1",
                                "--port", str(self.port), "--webui-port", str(free_port()),
                                "--cores", str(self.cores), "--memory", self.memory,
                                "--work-dir", str(self._marker()))
        self._launch(cmd, f"{self.stem}.stdout",
                     lambda p: self._wait_registered(p, began, timeout))
        return time.monotonic() - began

    def _wait_registered(self, proc: subprocess.Popen[bytes], began: float,
                         timeout: float) -> None:
        self._wait_port(proc, self.port, began, timeout, "spark worker")
        while "Successfully registered with master" not in self.log_tail():
            if proc.poll() is not None:
                raise RuntimeError(f"spark worker exited with {proc.returncode}:\n"
                                   f"{self.log_tail()}")
            if time.monotonic() - began > timeout:
                raise TimeoutError(f"spark worker did not register with {self.master_url} "
                                   f"in {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.25)

    def status(self) -> str:
        pid = self.running_pid()
        state = "stopped" if pid is None else f"running pid={pid}"
        return f"spark-worker {self.data_dir.name}: {state} ({self.cores} core, {self.memory})"


@dataclass
class SparkCluster:
    """A master and `workers` workers under `data_dir`, started and stopped together."""

    data_dir: Path
    workers: int = 2
    cores_per_worker: int = 1
    memory_per_worker: str = "1536m"
    master: SparkMaster = field(init=False)

    def __post_init__(self) -> None:
        self.master = SparkMaster(self.data_dir / "master")

    @property
    def url(self) -> str:
        return self.master.url

    def _workers(self, master_url: str = "") -> list[SparkWorker]:
        return [SparkWorker(self.data_dir / f"worker-{i}", master_url,
                            self.cores_per_worker, self.memory_per_worker)
                for i in range(1, self.workers + 1)]

    def start(self, timeout: float = 120.0) -> float:
        """Start (or reuse) the master, then each worker once it registered."""
        began = time.monotonic()
        self.master.start(timeout)
        for worker in self._workers(self.master.url):
            worker.start(timeout)
        return time.monotonic() - began

    def stop(self) -> None:
        for worker in self._workers():
            worker.stop()
        self.master.stop()

    def status(self) -> str:
        return "\n".join([self.master.status(), *(w.status() for w in self._workers())])
