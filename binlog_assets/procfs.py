"""This host's processes as Linux's /proc shows them: each one's parent, state, start
and command line. The follower sensors read it to tell a lost run's worker (gone, a
zombie, or its pid taken by a newer process); the dev stack to find the processes it
started."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    state: str  # R, S, D, ...; Z: a zombie, X: dead
    start_ticks: int  # since boot, in clock ticks

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")

    @property
    def started_at(self) -> float:
        """The start, in seconds since the epoch."""
        return _boot_time() + self.start_ticks / os.sysconf("SC_CLK_TCK")

    def cmdline(self) -> list[str]:
        """Its arguments; [] once it is gone (or for a kernel thread)."""
        try:
            raw = (PROC / str(self.pid) / "cmdline").read_bytes()
        except OSError:
            return []
        args = raw.split(b"\0")
        if args and not args[-1]:  # the usual trailing NUL; a retitled process has none
            args.pop()
        return [a.decode(errors="replace") for a in args]


def process(pid: int) -> Process | None:
    """Process `pid`, None when there is none."""
    try:
        # The command name in parentheses may hold spaces and parentheses itself.
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        return Process(pid, int(fields[1]), fields[0], int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def processes() -> Iterator[Process]:
    """Every process on the host; those that end while listed are left out."""
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (found := process(int(entry.name))) is not None:
            yield found


def children(pid: int) -> list[Process]:
    """The processes whose parent is `pid`, oldest first."""
    return sorted((p for p in processes() if p.ppid == pid), key=lambda p: p.start_ticks)


@cache
def _boot_time() -> float:
    line = next(line for line in (PROC / "stat").read_text().splitlines()
                if line.startswith("btime "))
    return float(line.split()[1])
