"""Child processes of the local stack: free ports, pid files that are really ours, stopping.

The broker, MariaDB and the Connect worker are each a child process with a pid file in
its data directory; these helpers are what they share.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

from binlog_assets.environment import live_pid
from binlog_assets.procfs import process


class LocalDaemon:
    """What the stack's daemons share: `<stem>.pid`, `<stem>.port` and `<stem>.log` under
    `data_dir`, the pid of a live instance, and stopping it (SIGTERM, SIGKILL after
    `stop_timeout`), launching it (`_launch`) and finding a live one to reuse
    (`_reuse_port`). Subclasses are dataclasses with `data_dir` and `port` fields and name a
    path on their command line (`_marker`) so that a stale pid file is not taken for theirs."""

    stem: ClassVar[str]
    stop_timeout: ClassVar[float] = 30.0
    data_dir: Path
    port: int | None

    @property
    def pid_file(self) -> Path:
        return self.data_dir / f"{self.stem}.pid"

    @property
    def port_file(self) -> Path:
        return self.data_dir / f"{self.stem}.port"

    @property
    def log_file(self) -> Path:
        return self.data_dir / f"{self.stem}.log"

    def _marker(self) -> Path:
        raise NotImplementedError

    def running_pid(self) -> int | None:
        """The pid of a live instance started from this directory, if any."""
        return live_pid(self.pid_file, str(self._marker()))

    def _reuse_port(self) -> bool:
        """True, with `port` read back from the port file, when an instance started from
        this directory is alive: `start()` then only waits for it."""
        if self.running_pid() is None or not self.port_file.exists():
            return False
        self.port = int(self.port_file.read_text())
        return True

    def _launch(self, cmd: Sequence[str], stdout_name: str,
                wait: Callable[[subprocess.Popen[bytes]], None],
                pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
        """Start `cmd` in its own session with its output appended to `stdout_name` under
        `data_dir`, record its pid and `port`, and `wait(proc)` for it to be ready;
        a failed or interrupted wait stops it.

        The stop goes to `proc` itself, not through `running_pid()`: for a moment after
        `Popen` returns, the child's /proc cmdline is still empty (the kernel closes the
        exec error pipe before it sets up the new arguments; 7 of 300 launches read it
        empty here), so the marker check would take the child for gone and leave it
        running."""
        with open(self.data_dir / stdout_name, "ab") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                pass_fds=pass_fds, env=self._launch_env(),
            )
        self.pid_file.write_text(str(proc.pid))
        self.port_file.write_text(str(self.port))
        try:
            wait(proc)
        except BaseException:
            terminate(proc.pid, self.stop_timeout)
            self.pid_file.unlink(missing_ok=True)
            raise
        return proc

    def _launch_env(self) -> dict[str, str] | None:
        """The child's environment; None inherits this process's."""
        return None

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM the daemon (each shuts down cleanly on it), SIGKILL it if it lingers."""
        pid = self.running_pid()
        if pid is not None:
            terminate(pid, self.stop_timeout if timeout is None else timeout)
        self.pid_file.unlink(missing_ok=True)


def free_port() -> int:
    """A loopback TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def terminate(pid: int, timeout: float) -> None:
    """SIGTERM `pid` and wait for it to exit, SIGKILL it after `timeout` seconds."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    while _alive(pid):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    # Our own children linger as zombies until reaped; reap them so they read as gone.
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie of another parent (the pid-file case across CLI calls) is as good as gone.
    found = process(pid)
    return found is not None and found.alive
