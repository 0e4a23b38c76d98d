"""The dev schema registry: Apicurio Registry 2.4.2.Final, for Debezium's Avro converter.

`make registry` rebuilds it from Maven Central into `.cache/jars/registry` (see
setup/maven/registry/pom.xml); only the targets and tests that use Avro build it. It runs
as a child JVM on loopback with its store in an H2 database file under its data directory,
so the schemas it handed out survive a restart: Kafka keeps records that name their
schema ids long after the registry that gave them restarts. (Apicurio 2.4's SQL store on
H2 is the variant Maven Central serves; its KafkaSQL and PostgreSQL builds are not
published there.)

Clients reach it two ways: Apicurio's own API (`apicurio_url`, what its Kafka Connect
converter is configured with) and the Confluent-compatible API (`ccompat_url`, what
confluent-kafka's `SchemaRegistryClient`, and so binlake's `debezium-avro`, take as
`url`). Schema ids are Apicurio content ids on both.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from binlog_assets.dev.process import LocalDaemon, free_port
from binlog_assets.environment import cache_dir

VERSION = "2.4.2.Final"
# The ccompat path of this version; the root answers only the registry's own API and UI.
CCOMPAT_PATH = "/apis/ccompat/v7"
APICURIO_PATH = "/apis/registry/v2"


def registry_jar() -> Path:
    """The runnable registry jar; a clear error when it has not been built."""
    jar = cache_dir() / "jars" / "registry" / f"apicurio-registry-{VERSION}-runner.jar"
    if not jar.is_file():
        raise FileNotFoundError(
            f"no schema registry at {jar}: run `make registry` (it builds "
            "setup/maven/registry/pom.xml, about 3 minutes the first time)")
    return jar


@dataclass
class SchemaRegistryServer(LocalDaemon):
    """One Apicurio Registry whose pid, port, log and H2 store live under `data_dir`."""

    stem: ClassVar[str] = "schema-registry"
    stop_timeout: ClassVar[float] = 20.0

    data_dir: Path
    port: int | None = None
    heap: str = "256m"
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def _marker(self) -> Path:
        return self.store

    @property
    def store(self) -> Path:
        """The H2 database's path stem (H2 adds `.mv.db`)."""
        return self.data_dir / "registry-db"

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("schema registry not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def ccompat_url(self) -> str:
        """The Confluent-compatible API: `schema_registry.url` for binlake."""
        return self.url + CCOMPAT_PATH

    @property
    def apicurio_url(self) -> str:
        """Apicurio's own API: `apicurio.registry.url` for its converter."""
        return self.url + APICURIO_PATH

    def start(self, timeout: float = 90.0) -> float:
        """Start (or reuse) the registry; returns the seconds until it reported ready."""
        began = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._reuse_port():
            self._wait_ready(began, timeout)
            return time.monotonic() - began
        jar = registry_jar()
        self.port = self.port or free_port()
        cmd = [
            "java", f"-Xmx{self.heap}", "-XX:+UseSerialGC",
            # C1 only: a dev registry answers a few lookups, and startup dominates here.
            "-XX:TieredStopAtLevel=1",
            "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={self.port}",
            # WRITE_DELAY=0: a schema is on disk when its id is returned, so even a
            # SIGKILL right after a registration loses nothing.
            f"-Dquarkus.datasource.jdbc.url=jdbc:h2:file:{self.store};WRITE_DELAY=0",
            # The pool's prod sizing (20 connections up front) is for a server, not a dev box.
            "-Dquarkus.datasource.jdbc.initial-size=1", "-Dquarkus.datasource.jdbc.min-size=1",
            "-Dquarkus.log.file.enable=true", f"-Dquarkus.log.file.path={self.log_file}",
            "-Dquarkus.log.console.enable=false",
            "-jar", str(jar),
        ]

        def ready(proc: subprocess.Popen[bytes]) -> None:
            self._proc = proc
            self._wait_ready(began, timeout)

        self._launch(cmd, "schema-registry.stdout", ready)
        return time.monotonic() - began

    def status(self) -> str:
        pid = self.running_pid()
        if pid is None:
            return f"schema registry: stopped (store in {self.store}.mv.db)"
        self.port = int(self.port_file.read_text())
        state = "ready" if self._ready() else "not ready"
        return (f"schema registry: running pid={pid} {state} {self.ccompat_url} "
                f"(Apicurio {VERSION}; log {self.log_file})")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health/ready", timeout=2) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def _wait_ready(self, began: float, timeout: float) -> None:
        while time.monotonic() - began < timeout:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(
                    f"schema registry exited with {self._proc.returncode}:\n{self._log_tail()}")
            if self._ready():
                return
            time.sleep(0.1)
        raise TimeoutError(f"schema registry on {self.url} not ready in {timeout:.0f}s:\n"
                           f"{self._log_tail()}")

    def _log_tail(self) -> str:
        parts = []
        for path in (self.data_dir / "schema-registry.stdout", self.log_file):
            if path.exists():
                parts.append(path.read_text(errors="replace")[-2000:])
        return "\n".join(parts)
