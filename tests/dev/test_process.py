"""LocalDaemon's launch and reuse, on a real child process (no broker needed)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from binlog_assets.dev.process import LocalDaemon, free_port


@dataclass
class SleeperDaemon(LocalDaemon):
    """A child that sleeps with the data directory on its command line as its marker."""

    stem: ClassVar[str] = "sleeper"
    stop_timeout: ClassVar[float] = 5.0

    data_dir: Path
    port: int | None = None

    def _marker(self) -> Path:
        return self.data_dir

    def command(self, code: str = "import time; time.sleep(60)") -> list[str]:
        return [sys.executable, "-c", code, str(self.data_dir)]


def wait_live(daemon: SleeperDaemon, seen: list[int]) -> Callable[[subprocess.Popen[bytes]], None]:
    """A readiness wait: until `running_pid()` finds the child (its /proc cmdline holds the
    marker once exec has set it up)."""
    def wait(proc: subprocess.Popen[bytes]) -> None:
        seen.append(proc.pid)
        deadline = time.monotonic() + 10
        while daemon.running_pid() != proc.pid:
            assert proc.poll() is None and time.monotonic() < deadline, "child never came up"
            time.sleep(0.001)
    return wait


def test_launch_records_pid_and_port_and_the_next_start_reuses_them(tmp_path: Path) -> None:
    daemon = SleeperDaemon(tmp_path, port=free_port())
    seen: list[int] = []
    proc = daemon._launch(daemon.command(), "sleeper.stdout", wait_live(daemon, seen))
    try:
        assert seen == [proc.pid]
        assert daemon.pid_file.read_text() == str(proc.pid)
        again = SleeperDaemon(tmp_path)
        assert again._reuse_port() and again.port == daemon.port
    finally:
        daemon.stop()
    assert proc.poll() is not None
    assert not SleeperDaemon(tmp_path)._reuse_port()


def test_a_failed_wait_stops_the_child_and_raises(tmp_path: Path) -> None:
    daemon = SleeperDaemon(tmp_path, port=free_port())
    launched: list[subprocess.Popen[bytes]] = []

    def wait(proc: subprocess.Popen[bytes]) -> None:
        launched.append(proc)
        raise TimeoutError("not ready")

    # The wait fails at once, while the child may not have finished its exec: it must be
    # stopped all the same. Many launches, to meet that moment (a few in a hundred).
    for _ in range(50):
        launched.clear()
        with pytest.raises(TimeoutError, match="not ready"):
            daemon._launch(daemon.command(), "sleeper.stdout", wait)
        assert launched[0].poll() is not None, "the child outlived its failed start"
    assert not daemon.pid_file.exists()
    assert daemon.running_pid() is None


def test_the_childs_output_goes_to_its_stdout_file(tmp_path: Path) -> None:
    daemon = SleeperDaemon(tmp_path, port=free_port())
    proc = daemon._launch(daemon.command("print('hello from the child')"), "sleeper.stdout",
                          lambda p: None)
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "sleeper.stdout").read_text() == "hello from the child\n"
    assert daemon.running_pid() is None  # exited: its pid file no longer counts
