"""How a run uses its process: librdkafka's prefetch sized to the run, the collector's
threshold while runs are in flight, a GIL hand-over for the poll thread, and a thread
for start-up waits that do not depend on each other. Figures behind them:
bench/RESULTS.md, "P1 pipeline throughput", "P2 slow handlers" and "P6 memory".
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

# The collector's first threshold during a run (see `raise_gc_threshold`).
_GC_THRESHOLD = 20_000
# Settings of a consumer that a producer (the dead-letter publisher) must not be given.
CONSUMER_KEYS = frozenset({
    "group.id", "group.instance.id", "auto.offset.reset", "enable.auto.commit",
    "enable.auto.offset.store", "isolation.level", "session.timeout.ms",
    "max.poll.interval.ms", "heartbeat.interval.ms", "fetch.min.bytes", "fetch.max.bytes",
    "fetch.wait.max.ms", "max.partition.fetch.bytes", "enable.partition.eof",
})


def consumer_defaults(max_in_flight: int) -> dict[str, object]:
    """librdkafka settings a run uses unless the Kafka config sets them: its prefetch,
    sized from `max_in_flight` (a run holds no more; librdkafka's own defaults of 100,000
    messages and 1 MiB fetches per partition only cost memory)."""
    return {
        "queued.min.messages": max(1000, max_in_flight // 2),
        "queued.max.messages.kbytes": 16384,
        "max.partition.fetch.bytes": 512 * 1024,
        # With a bounded queue, librdkafka's default 1 s backoff when it is full idles the
        # fetcher long after the run has emptied it.
        "fetch.queue.backoff.ms": 10,
        # librdkafka (2.10+) drops the bootstrap connection under a new client's first
        # FindCoordinator; the retry waits reconnect.backoff.ms / 2. Reconnects after a
        # failure still back off exponentially up to reconnect.backoff.max.ms.
        "reconnect.backoff.ms": 10,
    }


# Runs in progress in this process and the collector thresholds from before the first:
# concurrent runs (one per partition, in threads) must not restore them while another
# still runs, nor leave the raised threshold behind.
_gc_lock = threading.Lock()
_gc_runs = 0
_gc_saved: tuple[int, ...] = ()
_gc_frozen = False


def raise_gc_threshold() -> None:
    """As the first of the process's runs in progress starts: the threshold raised
    (events in flight are acyclic and freed by reference counting: at the default
    threshold the collector would run every few records and find nothing), and, at the
    process's first run, everything alive then (imported modules, Dagster's graph)
    frozen, so the collector does not rescan it while events churn."""
    global _gc_runs, _gc_saved, _gc_frozen
    with _gc_lock:
        if _gc_runs == 0:
            if not _gc_frozen:
                # Once only: an unfreeze puts everything frozen, the last round's cycles
                # included, in the oldest generation without counting it toward a full
                # collection, so a follower that froze and unfroze each round kept every
                # round's lanes and threads for good.
                gc.freeze()
                _gc_frozen = True
            _gc_saved = gc.get_threshold()
            gc.set_threshold(max(_gc_saved[0], _GC_THRESHOLD), *_gc_saved[1:])
        _gc_runs += 1


def restore_gc_threshold() -> None:
    """As the last run in progress ends: the threshold as it was."""
    global _gc_runs
    with _gc_lock:
        _gc_runs -= 1
        if _gc_runs == 0:
            gc.set_threshold(*_gc_saved)


def yield_gil() -> None:
    """Release the GIL and take it back: the threads waiting for it run first."""
    time.sleep(0)


T = TypeVar("T")


def timed(call: Callable[[], T]) -> tuple[T, float]:
    """What `call` returned and the seconds it took."""
    began = time.monotonic()
    return call(), time.monotonic() - began


class Started(threading.Thread, Generic[T]):
    """`call()` running in a thread of its own from now on; `result()` waits for it."""

    def __init__(self, call: Callable[[], T]) -> None:
        super().__init__(name="binlake-run-start", daemon=True)
        self._call = call
        self._value: T | None = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._value = self._call()
        except BaseException as exc:  # handed to whoever asks for the result
            self._error = exc

    def result(self, raise_error: bool = True) -> T | None:
        self.join()
        if self._error is not None and raise_error:
            raise self._error
        return self._value
