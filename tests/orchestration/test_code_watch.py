"""A code location whose server child died comes back: the watch reloads it.

`dagster code-server start` serves the location from a child process and never starts
another on its own; the test kills that child, as a crash or a missed heartbeat TTL
ends it, and the watch must get the location answering again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from binlog_assets.dev.code_watch import (
    HEARTBEAT_TTL_ENV,
    CodeWatch,
    Endpoint,
    dagster_dev_workspace,
    endpoints_from_workspace,
    with_heartbeat_ttl,
)
from binlog_assets.dev.process import free_port
from binlog_assets.procfs import children

# Liveness: a code server loads in about 5 s on an idle 2-core host.
DEADLINE = 120.0


def _grpc_children(pid: int) -> list[int]:
    """The `dagster api grpc` children of process `pid`."""
    return [p.pid for p in children(pid) if "grpc" in p.cmdline()]


def _answers(endpoint: Endpoint) -> bool:
    try:
        endpoint.client().ping("test")
    except Exception:
        return False
    return True


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {DEADLINE:.0f}s"
        time.sleep(0.5)


@pytest.mark.integration
def test_a_location_whose_server_child_died_is_reloaded(tmp_path: Path) -> None:
    (tmp_path / "defs.py").write_text("import dagster as dg\n\ndefs = dg.Definitions()\n")
    port = free_port()
    proxy = subprocess.Popen(
        [str(Path(sys.executable).with_name("dagster")), "code-server", "start",
         "-f", str(tmp_path / "defs.py"), "--location-name", "tiny",
         "-h", "127.0.0.1", "-p", str(port)],
        env=with_heartbeat_ttl({**os.environ, "DAGSTER_HOME": str(tmp_path)}),
        cwd=tmp_path, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = Endpoint("tiny", host="127.0.0.1", port=port)
    lines: list[str] = []
    watch = CodeWatch(lambda: [endpoint], every=0.5, misses=2, log=lines.append)
    try:
        _wait(lambda: _answers(endpoint), "the code server")
        [child] = _grpc_children(proxy.pid)
        os.kill(child, signal.SIGKILL)
        _wait(lambda: not _answers(endpoint), "the location's loss")
        assert proxy.poll() is None  # the proxy lives on, without a location to serve

        watch.start()
        _wait(lambda: watch.reloads and _answers(endpoint), "the reload")
        assert watch.reloads[0]["location"] == "tiny"
        assert watch.reloads[0]["reloaded"] is True, watch.reloads
        assert "did not answer 2 pings" in lines[0], lines
        assert lines[1] == "code location tiny answers again", lines
        [new_child] = _grpc_children(proxy.pid)
        assert new_child != child
        _wait(lambda: watch.unanswered_for() == 0.0, "the watch seeing it answer")
        assert len(watch.reloads) == 1  # an answering location is left alone
    finally:
        watch.stop.set()
        os.killpg(proxy.pid, signal.SIGKILL)
        proxy.wait()


def test_the_workspace_dagster_dev_hands_its_daemon(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(yaml.safe_dump({"load_from": [
        {"grpc_server": {"location_name": "binlake", "socket": "/tmp/a.sock",
                         "host": "localhost"}},
        {"grpc_server": {"location_name": "binlake_dbt", "port": 4001,
                         "host": "127.0.0.1"}},
        {"python_module": {"module_name": "not.served"}}]}))
    # A process of the group whose command line is the daemon's, as `dagster dev`
    # starts it.
    daemon = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "-m", "dagster._daemon",
         "run", "--workspace", str(workspace)], start_new_session=True)
    try:
        _wait(lambda: dagster_dev_workspace(daemon.pid) is not None, "the daemon")
        assert dagster_dev_workspace(daemon.pid) == workspace
        assert dagster_dev_workspace(os.getpgid(0)) is None
    finally:
        daemon.kill()
        daemon.wait()
    assert endpoints_from_workspace(workspace) == [
        Endpoint("binlake", host="localhost", socket="/tmp/a.sock"),
        Endpoint("binlake_dbt", host="127.0.0.1", port=4001)]


def test_the_heartbeat_ttl_is_set_unless_named() -> None:
    assert with_heartbeat_ttl({})[HEARTBEAT_TTL_ENV] == "180"
    assert with_heartbeat_ttl({HEARTBEAT_TTL_ENV: "45"})[HEARTBEAT_TTL_ENV] == "45"


def test_the_watch_outlives_an_error_finding_its_endpoints() -> None:
    calls: list[int] = []

    def endpoints() -> list[Endpoint]:
        calls.append(1)
        if len(calls) == 1:
            raise FileNotFoundError("workspace.yaml")  # dagster dev removed it meanwhile
        return []

    lines: list[str] = []
    watch = CodeWatch(endpoints, every=0.05, log=lines.append)
    watch.start()
    try:
        _wait(lambda: len(calls) >= 3, "the watch's next rounds")
    finally:
        watch.stop.set()
    assert "FileNotFoundError" in lines[0]
