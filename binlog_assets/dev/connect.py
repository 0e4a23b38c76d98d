"""Debezium in a Kafka Connect standalone worker: the dev stack's binlog -> Kafka leg.

`KafkaConnect` runs `org.apache.kafka.connect.cli.ConnectStandalone` as a child JVM over
the classpath Maven resolved into `.cache/jars/connect` (Connect 4.1.1, the broker's
version, and Debezium's MariaDB connector), writing to the embedded broker. Standalone
mode keeps the worker's state in files under its data directory: source offsets, and
the connector's schema history (the DDL it has seen, which it needs to decode rows after
a restart). The REST listener on loopback answers status checks and lets a caller add
further connectors to the running worker. Records use the JSON converter; with schemas
enabled each value is Debezium's `{"schema", "payload"}` envelope, so column types
reach the decoder.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import orjson

from binlog_assets.dev.mariadb import HEARTBEAT_DATABASE, HEARTBEAT_TABLE, MariaDBServer
from binlog_assets.dev.process import LocalDaemon, free_port
from binlog_assets.environment import jars_dir

_CONNECT_MAIN = "org.apache.kafka.connect.cli.ConnectStandalone"
# Seconds a reconfigured connector's task may still show the failure of the task before it.
_RESTART_GRACE = 10.0
_JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"

_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
# Debezium tags its threads' lines with the connector's logical name (topic.prefix).
appender.file.layout.pattern = [%d] %p [%X{{dbz.connectorLogicalName}}] %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
logger.jetty.name = org.eclipse.jetty
logger.jetty.level = WARN
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
"""


@dataclass(frozen=True)
class DebeziumConnector:
    """One Debezium MariaDB source connector: which server it reads, where it writes.

    Topics are `<topic_prefix>.<database>.<table>` for rows and `<topic_prefix>` for
    schema changes. `server_id` is the replica id the connector claims on the server's
    replication protocol, so two connectors on one server need different ids.
    """

    hostname: str
    port: int
    user: str
    password: str
    name: str = "binlake-mariadb"
    topic_prefix: str = "shop"
    server_id: int = 184054
    database_include_list: tuple[str, ...] = ()
    snapshot_mode: str = "initial"
    # Every so often Debezium writes the heartbeat table (`dev.mariadb`): its change moves
    # the source's position in the changelog while the captured tables are idle (parity's
    # wait, an idle replica's freshness). 0 turns heartbeats off.
    heartbeat_seconds: float = 5.0
    extra: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def for_server(cls, server: MariaDBServer, **settings: Any) -> DebeziumConnector:
        """The connector for a running `MariaDBServer`, as its Debezium account."""
        if server.port is None:
            raise RuntimeError("mariadb not started")
        return cls(hostname="127.0.0.1", port=server.port, user=server.debezium_user,
                   password=server.debezium_password, **settings)

    def config(self, state_dir: Path) -> dict[str, str]:
        """The connector's properties; its schema history is a file under `state_dir`."""
        props = {
            "name": self.name,
            "connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
            "tasks.max": "1",
            "database.hostname": self.hostname,
            "database.port": str(self.port),
            "database.user": self.user,
            "database.password": self.password,
            "database.server.id": str(self.server_id),
            # The dev server has no TLS; stated here rather than left to a driver default.
            "database.ssl.mode": "disable",
            "topic.prefix": self.topic_prefix,
            # Offsets are a file in the worker's directory, so the history is one beside
            # them: the two stay in step even when a test broker's data dir (where a
            # history topic would live) is thrown away and the worker is not.
            "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
            "schema.history.internal.file.filename": str(
                state_dir / f"{self.name}.schema-history.dat"
            ),
            "snapshot.mode": self.snapshot_mode,
            # Debezium hands rows to Connect every 500 ms by default, which is most of a
            # change's trip to Kafka; a dev source trades a little CPU for fast tests.
            "poll.interval.ms": "100",
            "include.schema.changes": "true",
            # Lossless numbers: a DECIMAL keeps its digits (not a double), a BIGINT
            # UNSIGNED above 2^63 stays positive (the default `long` wraps it), and every
            # column's MySQL type rides in its schema parameters, so the decoder types
            # INT UNSIGNED as bigint, BIGINT UNSIGNED as decimal(20,0) and DECIMAL(p,s)
            # with its own digits.
            "decimal.handling.mode": "precise",
            "bigint.unsigned.handling.mode": "precise",
            "column.propagate.source.type": ".*",
            "tombstones.on.delete": "true",
            # Debezium skips truncates unless told otherwise; a replica must see them.
            "skipped.operations": "none",
            # Connect creates topics itself, so the stack does not rely on the broker's
            # auto-creation; one partition keeps each table's changes in binlog order.
            "topic.creation.default.partitions": "1",
            "topic.creation.default.replication.factor": "1",
        }
        if self.heartbeat_seconds:
            props["heartbeat.interval.ms"] = str(int(self.heartbeat_seconds * 1000))
            props["heartbeat.action.query"] = (
                f"INSERT INTO {HEARTBEAT_DATABASE}.{HEARTBEAT_TABLE} (id, at) VALUES (1, "
                "NOW(3)) ON DUPLICATE KEY UPDATE at = NOW(3)")
        if self.database_include_list:
            props["database.include.list"] = ",".join(self.database_include_list)
        props.update(self.extra)
        return props


@dataclass
class KafkaConnect(LocalDaemon):
    """A Connect standalone worker whose files (config, offsets, logs) live under `data_dir`.

    `start()` launches the worker with `connector` and returns once that connector has
    finished its snapshot and streams the binlog: a write made after that is a change
    event, never folded into a snapshot read. Like the broker, it is idempotent: a worker
    already running from the same directory is reused, unless it was started for another
    broker or database (after a `stack-down`/`stack-up` the broker listens on a new
    port), which restarts it.
    `connector` may be left out for `stop()` and `status()`.
    """

    stem: ClassVar[str] = "connect"

    data_dir: Path
    bootstrap_servers: str = ""
    connector: DebeziumConnector | None = None
    port: int | None = None
    schemas_enable: bool = True
    heap: str = "512m"
    # Set only when this object launched the worker: lets a wait notice an early exit.
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def rest_url(self) -> str:
        if self.port is None:
            self._reuse_port()  # a worker another process started: its port file
        if self.port is None:
            raise RuntimeError("kafka connect not started")
        return f"http://127.0.0.1:{self.port}"

    def _marker(self) -> Path:
        return self._worker_file

    def start(self, timeout: float = 180.0) -> float:
        """Start (or reuse) the worker; returns the seconds until the connector's task ran."""
        connector = self.connector
        if connector is None or not self.bootstrap_servers:
            raise ValueError("starting kafka connect needs bootstrap_servers and a connector")
        began = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._reuse_port():
            if self._written_config() == self._config(connector):
                self.wait_running(connector.name, timeout - (time.monotonic() - began))
                return time.monotonic() - began
            self.stop()
        self.port = self.port or free_port()
        self._write_config(connector)
        cmd = [
            "java", f"-Xmx{self.heap}", "-Xms128m", "-XX:+UseG1GC",
            # C1 only: the worker moves a dev-sized trickle, and startup dominates here.
            "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-Djava.awt.headless=true",
            "-cp", f"{jars_dir('connect')}/*", _CONNECT_MAIN,
            str(self._worker_file), str(self._connector_file),
        ]
        log_from = self._log_size()

        def running(proc: subprocess.Popen[bytes]) -> None:
            self._proc = proc  # lets the wait notice an early exit
            self.wait_running(connector.name, timeout - (time.monotonic() - began))
            self.wait_streaming(connector, log_from, timeout - (time.monotonic() - began))

        self._launch(cmd, "connect.stdout", running)
        return time.monotonic() - began

    def status(self) -> str:
        pid = self.running_pid()
        if pid is None:
            return f"connect: stopped (data in {self.data_dir})"
        self.port = int(self.port_file.read_text())
        try:
            connectors = self._rest("GET", "/connectors?expand=status")
            states = "; ".join(
                f"{name}: {_summary(info['status'])}" for name, info in connectors.items()
            ) or "no connectors"
        except (OSError, ValueError) as exc:
            states = f"REST not answering ({exc})"
        return f"connect: running pid={pid} rest={self.rest_url} {states}"

    def connector_status(self, name: str) -> dict[str, Any]:
        """`GET /connectors/<name>/status`: the connector's and its tasks' states."""
        return self._rest("GET", f"/connectors/{name}/status")

    def add_connector(self, connector: DebeziumConnector, timeout: float = 120.0) -> float:
        """Run one more connector in this worker; returns the seconds until its task ran."""
        began = time.monotonic()
        log_from = self._log_size()
        config = connector.config(self.data_dir)
        self._rest("POST", "/connectors", {"name": connector.name, "config": config})
        self.wait_running(connector.name, timeout)
        self.wait_streaming(connector, log_from, timeout - (time.monotonic() - began))
        return time.monotonic() - began

    def remove_connector(self, name: str) -> None:
        self._rest("DELETE", f"/connectors/{name}")

    def reconfigure(self, connector: DebeziumConnector, timeout: float = 120.0, *,
                    running: bool = True) -> float:
        """Give a connector new settings (`PUT /connectors/<name>/config`, what a failover
        runbook does to point it at the promoted server); returns the seconds until it
        streams again. A stopped connector (`running` False) keeps them until resumed."""
        began = time.monotonic()
        log_from = self._log_size()
        self._rest("PUT", f"/connectors/{connector.name}/config",
                   connector.config(self.data_dir))
        if not running:
            return 0.0
        # A task that failed before the change (its heartbeat action refused by a server
        # just made read-only, say) shows FAILED until the change restarts it.
        try:
            self.wait_running(connector.name, _RESTART_GRACE)
        except (RuntimeError, TimeoutError):
            self._rest("POST", f"/connectors/{connector.name}/restart?includeTasks=true"
                               "&onlyFailed=true")
            self.wait_running(connector.name, timeout - (time.monotonic() - began))
        self.wait_streaming(connector, log_from, timeout - (time.monotonic() - began))
        return time.monotonic() - began

    def stop_connector(self, name: str, timeout: float = 60.0) -> None:
        """Stop the connector and its tasks, keeping its config (`PUT .../stop`)."""
        self._rest("PUT", f"/connectors/{name}/stop")
        deadline = time.monotonic() + timeout
        while self.connector_status(name)["connector"]["state"] != "STOPPED":
            if time.monotonic() > deadline:
                raise TimeoutError(f"connector {name} not stopped in {timeout:.0f}s")
            time.sleep(0.2)

    def reset_offsets(self, name: str) -> None:
        """Forget the stopped connector's source offsets (`DELETE .../offsets`): as if its
        offsets topic or file were lost."""
        self._rest("DELETE", f"/connectors/{name}/offsets")

    def resume_connector(self, connector: DebeziumConnector, timeout: float = 180.0) -> float:
        """Start a stopped connector again; returns the seconds until it streams (after
        the snapshot its settings call for)."""
        began = time.monotonic()
        log_from = self._log_size()
        self._rest("PUT", f"/connectors/{connector.name}/resume")
        self.wait_running(connector.name, timeout)
        self.wait_streaming(connector, log_from, timeout - (time.monotonic() - began))
        return time.monotonic() - began

    def wait_running(self, name: str, timeout: float) -> None:
        """Return when `name` and all its tasks are RUNNING; raise if one FAILED."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(
                    f"kafka connect exited with {self._proc.returncode}:\n{self._log_tail()}"
                )
            try:
                state = self.connector_status(name)
            except (OSError, ValueError) as exc:
                # Refused until Jetty binds, 404 until the connector is registered.
                last = str(exc)
            else:
                last = _summary(state)
                states = [state["connector"]["state"], *(t["state"] for t in state["tasks"])]
                if "FAILED" in states:
                    traces = [t.get("trace", "") for t in state["tasks"]]
                    raise RuntimeError(f"connector {name} failed: {last}\n{''.join(traces)}")
                if state["tasks"] and set(states) == {"RUNNING"}:
                    return
            time.sleep(0.25)
        raise TimeoutError(
            f"connector {name} not running after {timeout:.0f}s ({last}):\n{self._log_tail()}"
        )

    def wait_streaming(self, connector: DebeziumConnector, log_from: int, timeout: float) -> None:
        """Return once `connector` streams the binlog, as its log says past byte `log_from`.

        A task is RUNNING while its snapshot is still under way; rows written then are read
        by the snapshot (op `r`, at the snapshot's offset) rather than streamed as changes.
        Debezium reports the streaming phase only in its log (and JMX), so the log it is.
        """
        marker = f"[{connector.topic_prefix}] Starting streaming".encode()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(
                    f"kafka connect exited with {self._proc.returncode}:\n{self._log_tail()}"
                )
            with contextlib.suppress(FileNotFoundError), self.log_file.open("rb") as log:
                log.seek(log_from)
                if marker in log.read():
                    return
            state = self.connector_status(connector.name)
            if "FAILED" in {t["state"] for t in state["tasks"]}:
                raise RuntimeError(f"connector {connector.name} failed: {_summary(state)}")
            time.sleep(0.25)
        raise TimeoutError(
            f"connector {connector.name} not streaming after {timeout:.0f}s:\n{self._log_tail()}"
        )

    def offsets(self, name: str) -> list[dict[str, Any]]:
        """The connector's committed source offsets (`GET /connectors/<name>/offsets`)."""
        return self._rest("GET", f"/connectors/{name}/offsets").get("offsets", [])

    def _log_size(self) -> int:
        try:
            return self.log_file.stat().st_size
        except FileNotFoundError:
            return 0

    @property
    def _worker_file(self) -> Path:
        return self.data_dir / "worker.properties"

    @property
    def _connector_file(self) -> Path:
        return self.data_dir / "connector.properties"

    def _config(self, connector: DebeziumConnector) -> tuple[str, str]:
        """The worker's and the connector's properties files, as text."""
        schemas = "true" if self.schemas_enable else "false"
        worker_props = {
            "bootstrap.servers": self.bootstrap_servers,
            "key.converter": _JSON_CONVERTER,
            "value.converter": _JSON_CONVERTER,
            "key.converter.schemas.enable": schemas,
            "value.converter.schemas.enable": schemas,
            "offset.storage.file.filename": str(self.data_dir / "offsets.dat"),
            # Offsets on disk within a fifth of a second, so a restart resumes close to
            # where it was and a `DebeziumFence` sees its fence soon.
            "offset.flush.interval.ms": "200",
            "listeners": f"http://127.0.0.1:{self.port}",
            # Every plugin on this classpath ships a ServiceLoader manifest, so the slow
            # reflective scan of all jars (3 s of a 7 s start on this 2-core box) is skipped.
            "plugin.discovery": "service_load",
        }
        return _properties(worker_props), _properties(connector.config(self.data_dir))

    def _written_config(self) -> tuple[str, str] | None:
        try:
            return self._worker_file.read_text(), self._connector_file.read_text()
        except FileNotFoundError:
            return None

    def _write_config(self, connector: DebeziumConnector) -> None:
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2.format(log_file=self.log_file))
        worker_text, connector_text = self._config(connector)
        self._worker_file.write_text(worker_text)
        self._connector_file.write_text(connector_text)

    def _rest(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        data = orjson.dumps(body) if body is not None else None
        request = urllib.request.Request(
            self.rest_url + path, data=data, method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            raise ValueError(f"{method} {path}: HTTP {exc.code} {exc.read()[:500]!r}") from None
        return orjson.loads(payload) if payload else {}

    def _log_tail(self) -> str:
        parts = []
        for name in ("connect.stdout", "connect.log"):
            path = self.data_dir / name
            if path.exists():
                parts.append(path.read_text(errors="replace")[-2000:])
        return "\n".join(parts)


@dataclass(frozen=True)
class DebeziumFence:
    """Waits until a Debezium connector has published every change its MariaDB server
    committed before the wait began, with no quiet period to guess.

    A fence row is committed (`MariaDBServer.fence`, which gives the binlog position
    before it), then the connector's committed source offset is read from Connect's
    REST API until it is at or past that position. Connect commits a source offset only
    once Kafka has acknowledged every record sent before it, so by then every earlier
    change is in its topic. The connector must capture the fence's database (every
    database, as the dev connectors do).
    """

    connect: KafkaConnect
    source: MariaDBServer
    connector: str | None = None  # a connector of `connect` by name; its own by default

    def wait(self, timeout: float = 180.0) -> None:
        name = self.connector or (self.connect.connector.name if self.connect.connector
                                  else DebeziumConnector.name)
        fence = _binlog_point(*self.source.fence())
        gtid = _gtid_point(self.source.binlog_position()[2])
        deadline = time.monotonic() + timeout
        seen: dict[str, Any] = {}
        while time.monotonic() < deadline:
            for entry in self.connect.offsets(name):
                seen = entry.get("offset") or {}
                if _past(seen, fence, gtid, self.source.server_id):
                    return
            time.sleep(0.1)
        raise TimeoutError(f"connector {name} did not commit a source offset past the fence "
                           f"at {fence} (GTIDs {gtid}) in {timeout:.0f}s (last {seen})")


def _past(offset: dict[str, Any], fence: tuple[int, int], gtid: dict[str, int],
          server_id: int) -> bool:
    """Whether a connector's offset is at or past the fence. By GTID where both have
    them: binlog coordinates are one server's, and after a failover the promoted server's
    numbering may be anywhere (a connector still on the old index is not past). The
    offset's GTIDs are those of the transactions done before the one it stands in: in
    the fence's own, it is past once its coordinates are, on the fence's server."""
    seen = _gtid_point(offset.get("gtids") or "")
    at = "file" in offset and _binlog_point(offset["file"], offset.get("pos", 0)) >= fence
    if gtid and seen:
        behind = {domain: seq - seen.get(domain, -1) for domain, seq in gtid.items()}
        return all(b <= 0 for b in behind.values()) or (
            all(b <= 1 for b in behind.values()) and at
            and offset.get("server_id") == server_id)
    return at


def _binlog_point(file: str, position: int) -> tuple[int, int]:
    """A binlog position in order across files (`binlog.000012`, byte 4567)."""
    return int(file.rsplit(".", 1)[1]), int(position)


def _gtid_point(text: str) -> dict[str, int]:
    """A MariaDB GTID position (`0-1-12,1-3-4`) as domain -> sequence."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        pieces = part.split("-")
        if len(pieces) == 3 and all(p.isdigit() for p in pieces):
            out[pieces[0]] = int(pieces[2])
    return out


def _properties(props: Mapping[str, str]) -> str:
    # Java properties treat backslashes as escapes; the values here are paths and names.
    return "".join(f"{k}={v.replace(chr(92), chr(92) * 2)}\n" for k, v in props.items())


def _summary(state: dict[str, Any]) -> str:
    tasks = ",".join(t["state"] for t in state.get("tasks", ())) or "no tasks"
    return f"connector={state['connector']['state']} tasks={tasks}"
