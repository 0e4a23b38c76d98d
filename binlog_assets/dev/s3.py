"""An S3-compatible object store for the local stack: moto's server mode (from PyPI).

It serves the S3 API on `127.0.0.1:port`, in memory, with conditional writes
(`If-None-Match: *`), which is what delta-rs needs to commit safely to S3 without a
locking service. `env()` is what a process needs to use it: credentials, the endpoint,
plain HTTP, and delta-rs's conditional put (`AWS_CONDITIONAL_PUT=etag`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from binlog_assets.dev.process import LocalDaemon, free_port, port_open
from binlog_assets.procfs import process

if TYPE_CHECKING:
    import subprocess


@dataclass
class S3Server(LocalDaemon):
    """moto's S3 server on `127.0.0.1:port`; its output goes to `data_dir`."""

    stem: ClassVar[str] = "s3"

    data_dir: Path
    port: int | None = None
    access_key: str = "binlake"
    secret_key: str = "binlake-secret"
    region: str = "us-east-1"

    def _marker(self) -> Path:
        return self.data_dir

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise RuntimeError("s3 server not started")
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> float:
        began = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._reuse_port():
            return time.monotonic() - began
        self.port = self.port or free_port()
        cmd = [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1",
               "-p", str(self.port)]
        self._launch(cmd, f"{self.stem}.stdout", lambda p: self._wait(p, began, timeout))
        return time.monotonic() - began

    def running_pid(self) -> int | None:
        # moto_server takes no path to mark it on its command line: the pid file, checked
        # to name a moto_server still.
        if not self.pid_file.exists() or not self.port_file.exists():
            return None
        pid = int(self.pid_file.read_text())
        found = process(pid)
        return pid if found is not None and "moto_server" in " ".join(found.cmdline()) \
            else None

    def _wait(self, proc: subprocess.Popen, began: float, timeout: float) -> None:
        while not port_open(self.port):
            if proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {proc.returncode}")
            if time.monotonic() - began > timeout:
                raise TimeoutError(f"moto_server not listening on {self.port}")
            time.sleep(0.1)

    def env(self) -> dict[str, str]:
        """The environment that points S3 clients (delta-rs, boto3, hadoop-aws) here."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region,
                "AWS_ALLOW_HTTP": "true", "AWS_CONDITIONAL_PUT": "etag"}

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                     aws_secret_access_key=self.secret_key, region_name=self.region
                     ).create_bucket(Bucket=name)

    def status(self) -> str:
        if self.running_pid() is None or not self._reuse_port():
            return f"s3: stopped (data in {self.data_dir})"
        return f"s3: running pid={self.running_pid()} {self.endpoint}"
