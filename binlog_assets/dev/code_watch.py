"""Keeps the code locations of a running Dagster answering.

`dagster code-server start` (what `dagster dev` starts per location, and what a
deployment runs per location) serves a location from a child `dagster api grpc` process
and starts a new child only when asked to reload. The child ends itself when the
proxy's heartbeats stop reaching it for its TTL (30 s unless
`DAGSTER_GRPC_PROXY_HEARTBEAT_TTL_SECONDS` says otherwise), and a crash ends it too;
then the daemon's sensors and the run launcher get `Could not reach user code server`
until someone presses Reload in the UI. The watch pings each location and, after a few
unanswered pings in a row, reloads it as that button does.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from binlog_assets.procfs import processes

HEARTBEAT_TTL_ENV = "DAGSTER_GRPC_PROXY_HEARTBEAT_TTL_SECONDS"
# A child that misses its heartbeats for this long ends itself: long enough that a
# loaded host (a busy gRPC pool, a stalled scheduler) does not end it, short enough that
# an orphaned child goes within minutes.
HEARTBEAT_TTL = "180"
RELOAD_TIMEOUT = 180


def with_heartbeat_ttl(env: dict[str, str]) -> dict[str, str]:
    """`env` with the code servers' child heartbeat TTL, unless it already names one."""
    return {HEARTBEAT_TTL_ENV: HEARTBEAT_TTL, **env}


@dataclass(frozen=True)
class Endpoint:
    """Where a code location's server answers: a TCP port or a unix socket."""

    location: str
    host: str = "localhost"
    port: int | None = None
    socket: str | None = None

    def client(self):  # noqa: ANN201 - DagsterGrpcClient
        from dagster._grpc.client import DagsterGrpcClient

        return DagsterGrpcClient(port=self.port, socket=self.socket, host=self.host)


def endpoints_from_workspace(path: Path) -> list[Endpoint]:
    """The `grpc_server` entries of a workspace file (a `python_module` entry has no
    server of its own to watch)."""
    found = []
    for entry in (yaml.safe_load(path.read_text()) or {}).get("load_from", []):
        server = entry.get("grpc_server") if isinstance(entry, dict) else None
        if server:
            found.append(Endpoint(location=server.get("location_name", "?"),
                                  host=server.get("host", "localhost"),
                                  port=server.get("port"), socket=server.get("socket")))
    return found


def dagster_dev_workspace(group: int) -> Path | None:
    """The workspace `dagster dev` (process group `group`) hands its daemon: the code
    servers it started, as `grpc_server` entries."""
    for proc in processes():
        try:
            if os.getpgid(proc.pid) != group:
                continue
        except ProcessLookupError:
            continue
        words = proc.cmdline()
        if "dagster._daemon" in words and "--workspace" in words[:-1]:
            path = Path(words[words.index("--workspace") + 1])
            if path.is_file():
                return path
    return None


class CodeWatch(threading.Thread):
    """Pings every endpoint each `every` seconds; an endpoint unanswered `misses` times
    in a row is reloaded. `reloads` records each reload: the location, when, the error
    that triggered it and whether the location answered after it."""

    def __init__(self, endpoints: Callable[[], Iterable[Endpoint]], every: float = 10.0,
                 misses: int = 3, log: Callable[[str], None] = print) -> None:
        super().__init__(name="binlake-code-watch", daemon=True)
        self.endpoints, self.every, self.misses, self.log = endpoints, every, misses, log
        self.reloads: list[dict] = []
        self.stop = threading.Event()
        self._missed: dict[Endpoint, int] = {}
        self._since: dict[Endpoint, float] = {}

    def run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                for endpoint in self.endpoints():
                    self.check(endpoint)
            except Exception as e:
                # The endpoints come from a file `dagster dev` rewrites and removes.
                self.log(f"code watch: {type(e).__name__}: {e}; trying again")

    def unanswered_for(self) -> float:
        """Seconds the longest-unanswered endpoint has gone without answering (0: all
        answered their last ping)."""
        now = time.monotonic()
        return max((now - t for t in self._since.values()), default=0.0)

    def check(self, endpoint: Endpoint) -> bool:
        """Ping `endpoint`; reload it after `misses` unanswered pings in a row. Whether it
        answered."""
        try:
            endpoint.client().ping("binlake-code-watch")
        except Exception as e:
            self._since.setdefault(endpoint, time.monotonic())
            missed = self._missed.get(endpoint, 0) + 1
            self._missed[endpoint] = missed
            if missed >= self.misses:
                self._reload(endpoint, e)
            return False
        self._missed.pop(endpoint, None)
        self._since.pop(endpoint, None)
        return True

    def _reload(self, endpoint: Endpoint, error: Exception) -> None:
        cause = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        self.log(f"code location {endpoint.location} did not answer "
                 f"{self._missed[endpoint]} pings ({cause}); reloading it")
        record = {"location": endpoint.location, "at": time.time(), "cause": cause}
        try:
            endpoint.client().reload_code(timeout=RELOAD_TIMEOUT)
        except Exception as e:
            # The proxy starts the new child before it shuts the old one down, and
            # shutting a dead child down fails the call: whether the location answers
            # afterwards is what tells.
            record["reload_error"] = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        try:
            endpoint.client().ping("binlake-code-watch")
            record["reloaded"] = True
        except Exception:
            record["reloaded"] = False
        self.log(f"code location {endpoint.location} "
                 + ("answers again" if record["reloaded"] else
                    f"still does not answer ({record.get('reload_error', 'no error')})"))
        self.reloads.append(record)
        self._missed[endpoint] = 0
