"""Ctrl-C on `make dev`'s `dagster dev` stops it all, the run in progress included.

The wrapper (`binlog_assets.dev.dagster_dev`, what `make dev` runs after the stack) starts
in a pseudo-terminal as a user's shell would start it; its follower sensor launches a
follower run (a Spark session of its own). Ctrl-C is typed into the terminal once the
run is in its step; every process the wrapper started must be gone within the
deadline, and the run must end terminated (CANCELED), as the UI's Terminate leaves it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import subprocess
import sys
import termios
import time
from pathlib import Path

import dagster as dg
import pytest
from run_inputs import dagster_dev_env

from binlog_assets.config import PipelineConfig
from binlog_assets.dev.kafka import create_topic
from binlog_assets.dev.process import free_port
from binlog_assets.orchestration.replica_follower import FOLLOW_JOB_NAME
from binlog_assets.procfs import process, processes

# The product stops everything within 10 s; the test allows 3x that on a busy machine.
DEADLINE = 30.0


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for proc in processes():
        tree.setdefault(proc.ppid, []).append(proc.pid)
    return tree


def descendants(pid: int) -> set[int]:
    tree, found, todo = _children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    found = process(pid)
    return found is not None and found.alive


def _in_terminal(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[subprocess.Popen, int]:
    """Start `cmd` as the leader of a new session whose controlling terminal is a new pty
    (as a shell runs a foreground job); returns it and the terminal's master end."""
    master, slave = pty.openpty()

    def controlling_terminal() -> None:
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                            preexec_fn=controlling_terminal, close_fds=True)
    os.close(slave)
    return proc, master


def _drain(master: int, log: list[bytes]) -> None:
    os.set_blocking(master, False)
    try:
        while chunk := os.read(master, 65536):
            log.append(chunk)
    except (BlockingIOError, OSError):
        pass


@pytest.mark.timeout(600)
def test_ctrl_c_stops_dagster_dev_and_the_run_in_progress(pipeline_config: PipelineConfig,
                                                         tmp_path: Path) -> None:
    topic = create_topic(pipeline_config.bootstrap_servers, "ctrlc", partitions=1)
    env, workspace = dagster_dev_env(
        pipeline_config, tmp_path,
        {"name": "ctrlc", "topics": [topic], "tables": [{"source": "d.t", "replica": "t"}]},
        "binlake", dagster={"replica_follow_seconds": 600})
    home = Path(env["DAGSTER_HOME"])
    proc, master = _in_terminal(
        [sys.executable, "-m", "binlog_assets.dev.dagster_dev", "-w", str(workspace),
         "-h", "127.0.0.1", "-p", str(free_port())], env, tmp_path)
    out: list[bytes] = []
    try:
        run_id = _wait_for_follower_step(home, proc, master, out)
        started = descendants(proc.pid)
        assert len(started) >= 4, started  # dagster dev, webserver, daemon, code server, run
        os.write(master, b"\x03")  # Ctrl-C, as typed: SIGINT to the terminal's job
        typed = time.monotonic()
        while (time.monotonic() - typed < DEADLINE
               and (proc.poll() is None or any(alive(p) for p in started))):
            _drain(master, out)
            time.sleep(0.2)
        took = time.monotonic() - typed
        left = sorted(p for p in started if alive(p))
        log = b"".join(out).decode(errors="replace")[-4000:]
        assert proc.poll() is not None and not left, (
            f"{took:.1f}s after Ctrl-C, still running: wrapper {proc.poll()}, {left}\n{log}")
        print(f"\nCtrl-C to the last process gone: {took:.1f}s ({len(started)} processes)")
        with dg.DagsterInstance.from_config(str(home)) as instance:
            run = instance.get_run_by_id(run_id)
            assert run.status == dg.DagsterRunStatus.CANCELED, (run.status, log)
    finally:
        for pid in [proc.pid, *descendants(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        proc.wait(10)
        os.close(master)


def _wait_for_follower_step(home: Path, proc: subprocess.Popen, master: int,
                            out: list[bytes]) -> str:
    """The follower run's id, once it is in its step (its Spark started)."""
    deadline = time.monotonic() + 300
    with dg.DagsterInstance.from_config(str(home)) as instance:
        while time.monotonic() < deadline:
            _drain(master, out)
            assert proc.poll() is None, b"".join(out).decode(errors="replace")[-4000:]
            runs = instance.get_runs(dg.RunsFilter(job_name=FOLLOW_JOB_NAME,
                                                   statuses=[dg.DagsterRunStatus.STARTED]))
            for run in runs:
                records = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_START)
                if records:
                    time.sleep(5)  # into the follower's loop: Spark up, polling the changelog
                    return run.run_id
            time.sleep(0.5)
    raise AssertionError("no follower run reached its step:\n"
                         + b"".join(out).decode(errors="replace")[-4000:])
