"""What `procfs` reads of this host's processes: parent, state, start, command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from binlog_assets.procfs import children, process


def test_this_process_and_a_child_as_proc_shows_them() -> None:
    me = process(os.getpid())
    assert me is not None and me.ppid == os.getppid() and me.alive
    assert me.started_at <= time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        found = [p for p in children(os.getpid()) if p.pid == child.pid]
        assert len(found) == 1 and found[0].alive
        assert found[0].cmdline() == [sys.executable, "-c", "import time; time.sleep(30)"]
        assert found[0].started_at >= me.started_at
    finally:
        child.kill()
    # Killed and not yet reaped: a zombie, which is no live process.
    deadline = time.monotonic() + 30
    while (p := process(child.pid)) is not None and p.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p is not None and not p.alive and p.state == "Z"
    child.wait()
    assert process(child.pid) is None


def test_a_pid_without_a_process_is_none() -> None:
    with open("/proc/sys/kernel/pid_max") as f:
        assert process(int(f.read()) + 1) is None
