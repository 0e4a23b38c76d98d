"""The dev cache server: a `redis-server` from Debian's packages, for the handler example.

It runs as a child process over its own directory, on loopback only, with a password
(handlers read it from the environment like any secret) and no persistence: the cache
is rebuilt from the binlog, which is the point of the example.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from binlog_assets.dev.process import LocalDaemon, free_port, port_open

if TYPE_CHECKING:
    import redis

# The variable the example handler (and any user handler) reads the server's URL from.
REDIS_URL_ENV = "REDIS_URL"


@dataclass
class RedisServer(LocalDaemon):
    """One `redis-server` whose pid, port and log files live under `data_dir`."""

    stem: ClassVar[str] = "redis-server"
    stop_timeout: ClassVar[float] = 10.0

    data_dir: Path
    port: int | None = None
    password: str = "binlake-dev"

    def _marker(self) -> Path:
        return self.data_dir

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("redis-server is not started")
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20.0) -> float:
        """Start (or reuse) the server; returns the seconds until it answered a PING."""
        began = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self._reuse_port():
            self.port = self.port or free_port()
            self._launch(self._server_cmd(), "redis-server.stdout",
                         lambda proc: self._wait_ready(began, timeout, proc))
        else:
            self._wait_ready(began, timeout)
        return time.monotonic() - began

    def status(self) -> str:
        pid = self.running_pid()
        if pid is None:
            return f"redis: stopped (data in {self.data_dir})"
        return f"redis: running pid={pid} 127.0.0.1:{self.port_file.read_text()}"

    def client(self) -> redis.Redis:
        import redis

        return redis.Redis.from_url(self.url, decode_responses=True)

    def _server_cmd(self) -> list[str]:
        program = shutil.which("redis-server")
        if program is None:
            raise FileNotFoundError(
                "redis-server not found: run `make setup` (setup/apt.sh installs it)")
        # The data dir is named on the command line so that `live_pid` finds it (the
        # marker), and a stale pid file is not taken for this server.
        return [program, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.data_dir), "--requirepass", self.password,
                "--save", "", "--appendonly", "no", "--daemonize", "no",
                "--logfile", str(self.log_file),
                # Keep the command line (Redis rewrites it by default): the marker is there.
                "--set-proc-title", "no"]

    def _wait_ready(self, began: float, timeout: float,
                    proc: subprocess.Popen[bytes] | None = None) -> None:
        while time.monotonic() - began < timeout:
            if proc is not None and proc.poll() is not None:
                tail = self.log_file.read_text(errors="replace")[-2000:] if (
                    self.log_file.exists()) else ""
                raise RuntimeError(f"redis-server exited with {proc.returncode}:\n{tail}")
            if port_open(self.port):
                try:
                    if self.client().ping():
                        return
                except Exception:  # loading; retried until the deadline
                    pass
            time.sleep(0.05)
        raise TimeoutError(f"redis-server on 127.0.0.1:{self.port} not ready in {timeout}s")
