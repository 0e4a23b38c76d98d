"""The dev source database: a MariaDB server from Debian's packages, with a ROW binlog.

The end-to-end tests and the demo need a real binlog for Debezium to read, so this runs
`mariadbd` as a child process (never the system service) over its own data directory,
listening on loopback only, with the binlog settings a CDC source needs: `log_bin`,
`binlog_format=ROW`, `binlog_row_image=FULL`, its own `server_id`, strict GTIDs and
`log_slave_updates` (a replica's binlog holds what it replicates, as a promotable
replica's must). The server ignores /etc/mysql (`--no-defaults`), so nothing a user set
up for the system service leaks in. A `debezium` account gets the grants the connector
documents. For the failover drills a server replicates another by GTID
(`replicate_from`) and is promoted (`promote`), as an operator's runbook does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from binlog_assets.dev.process import LocalDaemon, free_port

if TYPE_CHECKING:
    import pymysql

# Unix socket paths are limited to 108 bytes (sun_path); a deep BINLAKE_VAR_DIR would
# otherwise fail inside mariadbd with a message that does not name the cause.
_MAX_SOCKET_PATH = 100

# MariaDB 10.5 renamed REPLICATION CLIENT to BINLOG MONITOR (the old name is an alias);
# LOCK TABLES lets the snapshot fall back to table locks where a global lock is refused.
_DEBEZIUM_GRANTS = (
    "SELECT, RELOAD, SHOW DATABASES, LOCK TABLES, REPLICATION SLAVE, BINLOG MONITOR"
)

# The table whose row `fence()` changes (`dev.connect.DebeziumFence`).
FENCE_DATABASE, FENCE_TABLE = "binlake_fence", "ticks"
# The table Debezium's heartbeat action writes (`DebeziumConnector.heartbeat_seconds`):
# a change in the binlog every beat, so each source's position moves while its tables
# are idle. Debezium's account may write it, and nothing else.
HEARTBEAT_DATABASE, HEARTBEAT_TABLE = "binlake_heartbeat", "beat"


@dataclass
class MariaDBServer(LocalDaemon):
    """One `mariadbd` whose files (datadir, socket, logs, pid) live under `data_dir`.

    `start()` is idempotent like the broker's: a server already running from the same
    directory is reused, on the port it was started with.
    """

    stem: ClassVar[str] = "mariadbd"
    stop_timeout: ClassVar[float] = 60.0  # on SIGTERM it flushes InnoDB, closes the binlog

    data_dir: Path
    port: int | None = None
    debezium_user: str = "debezium"
    debezium_password: str = "dbz"
    server_id: int = 1
    buffer_pool: str = "64M"

    @property
    def datadir(self) -> Path:
        return self.data_dir / "data"

    @property
    def socket(self) -> Path:
        return self.data_dir / "mariadbd.sock"

    @property
    def log_file(self) -> Path:
        """mariadbd's error log (`--log-error`)."""
        return self.data_dir / "mariadbd.err"

    @property
    def tmpdir(self) -> Path:
        """The server's own temporary files: a shared /tmp let another process's cleanup
        remove a bootstrap's temporary tables mid-install."""
        return self.data_dir / "tmp"

    def _marker(self) -> Path:
        return self.datadir

    def start(self, timeout: float = 60.0) -> float:
        """Start (or reuse) the server; returns the seconds until it accepted clients."""
        began = time.monotonic()
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        if len(str(self.socket)) > _MAX_SOCKET_PATH:
            raise ValueError(
                f"{self.socket} is too long for a unix socket path: use a shorter data_dir"
            )
        if self._reuse_port():
            self._wait_ready(began, timeout)
            return time.monotonic() - began
        if not (self.datadir / "mysql").is_dir():
            self._install_db()
        self.port = self.port or free_port()
        def ready(proc: subprocess.Popen[bytes]) -> None:
            self._wait_ready(began, timeout, proc)
            self._grant_debezium()

        self._launch(self._server_cmd(), "mariadbd.stdout", ready)
        return time.monotonic() - began

    def status(self) -> str:
        pid = self.running_pid()
        if pid is None:
            return f"mariadb: stopped (data in {self.data_dir})"
        port = self.port_file.read_text() if self.port_file.exists() else "?"
        return f"mariadb: running pid={pid} 127.0.0.1:{port} socket={self.socket}"

    def connect(self, database: str | None = None, **kwargs: Any) -> pymysql.Connection:
        """An autocommit root connection over the server's socket (admin and test DML)."""
        # PyMySQL is a dev dependency, and the orchestration code imports the dev stack
        # module (for the embedded broker's address), so it is imported only when used.
        import pymysql

        return pymysql.connect(
            unix_socket=str(self.socket), user="root", database=database,
            autocommit=True, charset="utf8mb4", **kwargs,
        )

    def fence(self) -> tuple[str, int]:
        """Commit one change to the fence table; returns the binlog position before it,
        past every change committed before the call (`dev.connect.DebeziumFence`)."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW MASTER STATUS")
                file, position = cur.fetchone()[:2]
                # Created once: a CREATE ... IF NOT EXISTS is logged even when it does
                # nothing, and each would be one more schema-change record.
                cur.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = %s"
                            " AND table_name = %s", (FENCE_DATABASE, FENCE_TABLE))
                if cur.fetchone() is None:
                    cur.execute(f"CREATE DATABASE IF NOT EXISTS {FENCE_DATABASE}")
                    cur.execute(f"CREATE TABLE IF NOT EXISTS {FENCE_DATABASE}.{FENCE_TABLE} "
                                "(id INT PRIMARY KEY, n BIGINT NOT NULL)")
                cur.execute(f"INSERT INTO {FENCE_DATABASE}.{FENCE_TABLE} VALUES (1, 1) "
                            "ON DUPLICATE KEY UPDATE n = n + 1")
            return file, int(position)
        finally:
            conn.close()

    def execute(self, *statements: str) -> list[tuple]:
        """Run `statements` as root, in order; the rows of the last one."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                rows: list[tuple] = []
                for statement in statements:
                    cur.execute(statement)
                    rows = list(cur.fetchall() or ())
                return rows
        finally:
            conn.close()

    def binlog_position(self) -> tuple[str, int, str]:
        """(binlog file, position, GTID position) where the server's binlog stands."""
        [(file, pos, *_)] = self.execute("SHOW MASTER STATUS")
        [(gtid,)] = self.execute("SELECT @@gtid_binlog_pos")
        return file, int(pos), gtid

    def rotate_binlog(self, times: int = 1) -> None:
        """Start `times` new binlog files (FLUSH BINARY LOGS)."""
        for _ in range(times):
            self.execute("FLUSH BINARY LOGS")

    def replicate_from(self, primary: MariaDBServer, *, fresh: bool = True) -> None:
        """Become a GTID replica of `primary`, as a replica is set up: with `fresh`, its own
        binlog and GTID state are reset first (its binlog numbering starts again at 1)
        and it replicates the primary's whole binlog; else it resumes from the GTID
        position it has (a former primary rejoining)."""
        if primary.port is None:
            raise RuntimeError("the primary is not started")
        steps = ["STOP SLAVE", "RESET SLAVE ALL"]
        if fresh:
            steps += ["RESET MASTER", "SET GLOBAL gtid_slave_pos = ''"]
        else:
            steps += ["SET GLOBAL gtid_slave_pos = @@gtid_binlog_pos"]
        self.execute(*steps,
                     f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={primary.port}, "
                     "MASTER_USER='root', MASTER_USE_GTID=slave_pos",
                     "START SLAVE", "SET GLOBAL read_only = 1")

    def wait_replicated(self, primary: MariaDBServer, timeout: float = 60.0) -> None:
        """Return once this replica has applied everything `primary` has committed."""
        [(target,)] = primary.execute("SELECT @@gtid_binlog_pos")
        deadline = time.monotonic() + timeout
        status: dict = {}
        while time.monotonic() < deadline:
            [(ok,)] = self.execute(f"SELECT MASTER_GTID_WAIT('{target}', 1)")
            if ok == 0:
                return
            status = self.replica_status()
            if status.get("Last_SQL_Errno") or status.get("Last_IO_Errno"):
                raise RuntimeError(f"replication of {primary.data_dir} failed: "
                                   f"{status.get('Last_SQL_Error') or status.get('Last_IO_Error')}")
        raise TimeoutError(f"replica not at {target} after {timeout:.0f}s: {status}")

    def replica_status(self) -> dict:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW SLAVE STATUS")
                row = cur.fetchone()
                return {} if row is None else dict(zip([d[0] for d in cur.description], row,
                                                       strict=True))
        finally:
            conn.close()

    def promote(self) -> None:
        """Stop replicating and take writes: the promoted replica of a failover."""
        self.execute("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = 0")

    def demote(self) -> None:
        """Stop taking writes (the old primary, before a failover)."""
        self.execute("SET GLOBAL read_only = 1")

    def _install_db(self) -> None:
        # "normal" root auth (no unix_socket plugin) lets the root user connect whoever
        # runs the tests; the server only listens on loopback and its own socket.
        cmd = [
            _program("mariadb-install-db"), "--no-defaults", f"--datadir={self.datadir}",
            "--auth-root-authentication-method=normal", "--skip-test-db",
            "--skip-name-resolve", f"--tmpdir={self.tmpdir}", *self._user_args(),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(
                f"mariadb-install-db failed ({done.returncode}):\n{done.stdout[-2000:]}"
                f"{done.stderr[-2000:]}"
            )

    def _server_cmd(self) -> list[str]:
        return [
            _program("mariadbd"), "--no-defaults", f"--datadir={self.datadir}", *self._user_args(),
            "--bind-address=127.0.0.1", f"--port={self.port}", f"--socket={self.socket}",
            f"--pid-file={self.data_dir / 'mariadbd.server.pid'}",
            f"--log-error={self.log_file}", f"--tmpdir={self.tmpdir}",
            "--skip-name-resolve",
            # Debian's packaged config sets utf8mb4; --no-defaults would fall back to latin1.
            "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
            "--log-bin=binlog", "--binlog-format=ROW", "--binlog-row-image=FULL",
            f"--server-id={self.server_id}", "--gtid-strict-mode=ON", "--log-slave-updates=ON",
            # Small on purpose: the machine is shared with Kafka, Connect and Spark.
            f"--innodb-buffer-pool-size={self.buffer_pool}",
        ]

    @staticmethod
    def _user_args() -> list[str]:
        # mariadbd refuses to run as root unless told that root is intended.
        return ["--user=root"] if os.geteuid() == 0 else []

    def _grant_debezium(self) -> None:
        # PyMySQL quotes the arguments client-side, so the account name may be one too.
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s",
                        (self.debezium_user, self.debezium_password))
            cur.execute(f"GRANT {_DEBEZIUM_GRANTS} ON *.* TO %s@'%%'", (self.debezium_user,))
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {HEARTBEAT_DATABASE}")
            cur.execute(f"CREATE TABLE IF NOT EXISTS {HEARTBEAT_DATABASE}.{HEARTBEAT_TABLE} "
                        "(id INT PRIMARY KEY, at DATETIME(3) NOT NULL)")
            cur.execute(f"GRANT INSERT, UPDATE ON {HEARTBEAT_DATABASE}.{HEARTBEAT_TABLE} "
                        "TO %s@'%%'", (self.debezium_user,))

    def _wait_ready(
        self, began: float, timeout: float, proc: subprocess.Popen[bytes] | None = None
    ) -> None:
        import pymysql

        while time.monotonic() - began < timeout:
            if proc is not None and proc.poll() is not None:
                tail = self.log_file.read_text(errors="replace")[-2000:] if (
                    self.log_file.exists()) else ""
                raise RuntimeError(f"mariadbd exited with {proc.returncode}:\n{tail}")
            if self.socket.exists():
                try:
                    with self.connect(connect_timeout=2) as conn, conn.cursor() as cur:
                        cur.execute("SELECT 1")
                    return
                except pymysql.err.OperationalError:
                    pass  # socket bound before the server accepts logins; retried
            time.sleep(0.1)
        raise TimeoutError(f"mariadb on {self.socket} not ready in {timeout}s")


def _program(name: str) -> str:
    # mariadbd lives in /usr/sbin, which a non-root user's PATH often leaves out.
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/bin")
    if found is None:
        raise FileNotFoundError(
            f"{name} not found: run `make setup` (setup/apt.sh installs mariadb-server)"
        )
    return found
