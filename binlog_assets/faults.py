"""Fault injection for the failure drills: SIGKILL the process at a named boundary.

`fault_point(name)` is called at the commit boundaries of a run. It does nothing unless
the process was started with `BINLAKE_FAULT=<name>` (read once, at import): then, the
`BINLAKE_FAULT_HIT`-th time (default 1) that boundary is reached, it SIGKILLs the Spark
driver JVM of the process (when there is one) and then the process itself: a crash
with no `finally`, no consumer close, no JVM shutdown hook. With `BINLAKE_FAULT_DELAY`
seconds (default 0) the kill comes from a timer thread that long after the boundary, so
it lands inside whatever runs next (a MERGE, say). Before the kill one line,
`binlake-fault: SIGKILL at <name> (hit <n>)`, goes to stderr so a drill can tell its
kill from any other death. Unset, a call costs one comparison with None.

Boundaries (in the order a run meets them):
  after_fetch             a batch came back from Kafka, nothing of it handled yet
  after_dead_letter_send  a lane handed a dead letter to the producer (`produce()`); the
                          broker has not acknowledged it (no delivery callback, no flush)
  after_handlers          a commit point: handlers finished, changelog not yet written
  after_changelog_commit  the changelog's Delta commit is in, Kafka's commit not yet
  after_kafka_commit      Kafka's commit is in, the run's Dagster metadata not yet
  after_metadata_write    the materialization (metadata) is recorded, no replica built
  during_replica_merge    a replica's MERGE (or initial append) is about to run
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

ENV_POINT = "BINLAKE_FAULT"
ENV_HIT = "BINLAKE_FAULT_HIT"
ENV_DELAY = "BINLAKE_FAULT_DELAY"
MARKER = "binlake-fault: SIGKILL at"

POINTS = (
    "after_fetch",
    "after_dead_letter_send",
    "after_handlers",
    "after_changelog_commit",
    "after_kafka_commit",
    "after_metadata_write",
    "during_replica_merge",
)

_POINT = os.environ.get(ENV_POINT) or None
if _POINT is not None and _POINT not in POINTS:
    raise ValueError(f"{ENV_POINT}={_POINT!r}: not a fault point; one of {', '.join(POINTS)}")
_HIT = int(os.environ.get(ENV_HIT) or 1)
_DELAY = float(os.environ.get(ENV_DELAY) or 0)
_hits = 0
_lock = threading.Lock()


def fault_point(name: str) -> None:
    """SIGKILL this process here when `BINLAKE_FAULT` names this boundary (see above)."""
    if _POINT is None or name != _POINT:
        return
    global _hits
    with _lock:
        _hits += 1
        if _hits != _HIT:
            return
    if _DELAY > 0:
        timer = threading.Timer(_DELAY, _kill, (name,))
        timer.daemon = True
        timer.start()
    else:
        _kill(name)


def _kill(name: str) -> None:
    os.write(2, f"{MARKER} {name} (hit {_HIT})\n".encode())
    # The Spark driver JVM would otherwise notice its Python parent is gone and exit
    # cleanly, possibly finishing a commit first: a crash takes it down at once.
    pyspark = sys.modules.get("pyspark")
    gateway = getattr(getattr(pyspark, "SparkContext", None), "_gateway", None)
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
