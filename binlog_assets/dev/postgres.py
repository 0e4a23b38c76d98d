"""The dev PostgreSQL server: the production storage of a Dagster instance, locally.

SQLite serves one `dagster dev` well, but concurrent runs, the daemon and the webserver
writing one event log is what production puts on PostgreSQL (setup/dagster-postgres.yaml).
This starts Debian's `postgres` as a child process over its own directory, on loopback
only, with a password, and creates the instance's database. PostgreSQL refuses to run
as root: as root, the server runs as the `postgres` user the package creates.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from binlog_assets.dev.process import LocalDaemon, free_port, port_open
from binlog_assets.environment import REPO_ROOT

# Debian installs the server's programs outside PATH, one folder per major version.
_PG_ROOT = Path("/usr/lib/postgresql")
# What setup/dagster-postgres.yaml reads the instance's storage from.
DAGSTER_PG_URL_ENV = "BINLAKE_DAGSTER_PG_URL"


def pg_program(name: str) -> str:
    """`initdb`, `postgres`: from PATH, else the newest Debian version's folder."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted((p for p in _PG_ROOT.glob("*/bin") if (p / name).exists()),
                      key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    if not versions:
        raise FileNotFoundError(f"{name} not found: run `make setup` (setup/apt.sh installs "
                                f"PostgreSQL)")
    return str(versions[-1] / name)


@dataclass
class PostgresServer(LocalDaemon):
    """One `postgres` whose cluster, pid, port and log files live under `data_dir`."""

    stem: ClassVar[str] = "postgres"
    stop_timeout: ClassVar[float] = 30.0

    data_dir: Path
    port: int | None = None
    user: str = "binlake"
    password: str = "binlake-dev"
    database: str = "dagster"

    @property
    def cluster(self) -> Path:
        return self.data_dir / "pgdata"

    def _marker(self) -> Path:
        return self.cluster

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("postgres is not started")
        # The driver named: SQLAlchemy 2.1 takes a bare `postgresql://` for psycopg 3,
        # and dagster-postgres installs psycopg2.
        return (f"postgresql+psycopg2://{self.user}:{self.password}@127.0.0.1:{self.port}/"
                f"{self.database}")

    def start(self, timeout: float = 60.0) -> float:
        """Start (or reuse) the server and create the database; returns the seconds until
        it took connections."""
        began = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self._reuse_port():
            if not (self.cluster / "PG_VERSION").exists():
                self._initdb()
            self.port = self.port or free_port()
            self._launch(self._as_owner(self._server_cmd()), "postgres.stdout",
                         lambda proc: self._wait_ready(began, timeout, proc))
        else:
            self._wait_ready(began, timeout)
        self._create_database()
        return time.monotonic() - began

    def status(self) -> str:
        pid = self.running_pid()
        if pid is None:
            return f"postgres: stopped (data in {self.data_dir})"
        return f"postgres: running pid={pid} 127.0.0.1:{self.port_file.read_text()}"

    def connect(self, database: str | None = None):  # noqa: ANN201 - a psycopg2 connection
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user,
                                password=self.password, dbname=database or "postgres")
        conn.autocommit = True
        return conn

    def _owner(self) -> pwd.struct_passwd | None:
        """The account the server runs as when this process is root (postgres refuses
        root); None otherwise."""
        return pwd.getpwnam("postgres") if os.geteuid() == 0 else None

    def _as_owner(self, cmd: list[str]) -> list[str]:
        owner = self._owner()
        # setpriv execs in place (runuser would stay as the parent): the pid recorded is
        # the server's.
        return cmd if owner is None else ["setpriv", f"--reuid={owner.pw_uid}",
                                          f"--regid={owner.pw_gid}", "--init-groups", *cmd]

    def _initdb(self) -> None:
        owner = self._owner()
        pwfile = self.data_dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        if owner is not None:
            for path in (self.data_dir, pwfile):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        # Password over TCP (what the instance's URL uses), no local socket trust.
        subprocess.run(self._as_owner([
            pg_program("initdb"), "-D", str(self.cluster), "-U", self.user,
            "--pwfile", str(pwfile), "--auth-host=scram-sha-256", "--auth-local=reject",
            "-E", "UTF8", "--no-instructions"]),
            check=True, capture_output=True, timeout=120)
        pwfile.unlink()

    def _server_cmd(self) -> list[str]:
        return [pg_program("postgres"), "-D", str(self.cluster), "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
                "-c", f"log_directory={self.data_dir}", "-c", "logging_collector=off",
                # An event log per run, the daemon and the webserver: a few dozen clients.
                "-c", "max_connections=200", "-c", "shared_buffers=128MB"]

    def _launch(self, cmd, stdout_name, wait, pass_fds=()):  # noqa: ANN001, ANN202
        owner = self._owner()
        if owner is not None:  # the server writes its pid and log here
            os.chown(self.data_dir, owner.pw_uid, owner.pw_gid)
        return super()._launch(cmd, stdout_name, wait, pass_fds)

    def _wait_ready(self, began: float, timeout: float,
                    proc: subprocess.Popen[bytes] | None = None) -> None:
        while time.monotonic() - began < timeout:
            if proc is not None and proc.poll() is not None:
                out = self.data_dir / "postgres.stdout"
                tail = out.read_text(errors="replace")[-2000:] if out.exists() else ""
                raise RuntimeError(f"postgres exited with {proc.returncode}:\n{tail}")
            if port_open(self.port):
                try:
                    self.connect().close()
                    return
                except Exception:
                    pass
            time.sleep(0.1)
        raise TimeoutError(f"postgres on 127.0.0.1:{self.port} not ready in {timeout}s")

    def _create_database(self) -> None:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{self.database}"')
        finally:
            conn.close()


def postgres_instance_yaml() -> str:
    """The shipped instance settings (setup/dagster.yaml) with the PostgreSQL storage of
    setup/dagster-storage-postgres.yaml: a $DAGSTER_HOME/dagster.yaml whose storage URL
    is read from `BINLAKE_DAGSTER_PG_URL`."""
    setup = REPO_ROOT / "setup"
    return ((setup / "dagster.yaml").read_text() + "\n"
            + (setup / "dagster-storage-postgres.yaml").read_text())
