"""Spark Connect calls waiting for their server.

The Connect client retries a call its server does not answer (UNAVAILABLE: stopped,
restarting, unreachable) with a growing back-off, for about ten minutes, and says nothing
meanwhile: a run whose apply is in such a call would look merely slow. The sessions
binlake opens note each retry here (`note_retries`), and a run names the server and how
long its calls have waited (`SPARK_WAITS.lines()`) while the wait lasts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The client's back-off reaches 60 s between tries: a server with no retry noted for
# longer than that is taken to answer again.
QUIET_SECONDS = 75.0
# One line per server at most this often, however many calls retry on it.
REPORT_EVERY_SECONDS = 30.0


@dataclass
class _Wait:
    first: float  # the first retry of this wait
    last: float  # the latest retry
    error: str  # the latest retry's error
    reported: float | None = None  # when a line last named it


class Waits:
    """The servers calls are retrying on, by url."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._open: dict[str, _Wait] = {}

    def note(self, url: str, error: str) -> None:
        now = self.clock()
        with self._lock:
            wait = self._open.get(url)
            if wait is None or now - wait.last > QUIET_SECONDS:
                self._open[url] = _Wait(now, now, error)
            else:
                wait.last, wait.error = now, error

    def lines(self) -> list[str]:
        """A line for each server some call still waits on, unless one was given for it
        in the last `REPORT_EVERY_SECONDS`; a server quiet for `QUIET_SECONDS` is
        forgotten."""
        now, out = self.clock(), []
        with self._lock:
            for url, wait in list(self._open.items()):
                if now - wait.last > QUIET_SECONDS:
                    del self._open[url]
                elif wait.reported is None or now - wait.reported >= REPORT_EVERY_SECONDS:
                    wait.reported = now
                    out.append(f"Spark Connect at {url} has not answered for "
                               f"{now - wait.first:.0f} s ({wait.error}): the Spark calls on "
                               f"it wait, retried by the client for up to about 10 minutes")
        return out


SPARK_WAITS = Waits()


def _error_line(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    try:
        named = f"{code().name}: {details()}" if callable(code) and callable(details) else ""
    except Exception:
        named = ""
    text = named or f"{type(exc).__name__}: {exc}"
    return text.strip().splitlines()[0][:200] if text.strip() else type(exc).__name__


def note_retries(client: Any, url: str, waits: Waits = SPARK_WAITS) -> None:
    """Make `client` (a Connect session's `SparkConnectClient`) note in `waits` each call
    it retries: its default policy, same back-off, noting each error it retries."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    class Noted(DefaultPolicy):
        def can_retry(self, exception: BaseException) -> bool:
            retried = super().can_retry(exception)
            if retried:
                waits.note(url, _error_line(exception))
            return retried

    client.set_retry_policies([Noted() if type(p) is DefaultPolicy else p
                               for p in client.get_retry_policies()])
