"""Calling the user's handlers: retries, fan-out, batches, dead letters, and their numbers.

The lanes decide what runs when (`lanes.py`); this module decides how one event, or one
run of consecutive events of a table, goes through that table's handlers, and keeps per
handler what the run reports: events, errors, retries, dead letters, latency, and calls
that ran past `timeout_seconds` (found by the lanes' patrol, named in the log).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING

from binlog_assets.consume.errors import (
    BreakerOpenError,
    DeadLetter,
    ErrorPolicy,
    KeyBreaker,
    mark_failed_handlers,
)
from binlog_assets.consume.handlers import Handler
from binlog_assets.formats.event import ChangeEvent

if TYPE_CHECKING:
    from binlog_assets.consume.scheduling import Slot

log = logging.getLogger(__name__)

# At most this many events go to a batch handler in one call.
BATCH_MAX_EVENTS = 500


class Stopping(Exception):
    """Raised out of a retry backoff when the dispatcher stops."""


@dataclass(frozen=True)
class HandlerMetrics:
    """One handler's numbers over a run, for its metadata (numbers, so the UI charts them)."""

    events: int  # events it handled without an error (a batch counts its events)
    errors: int  # calls that raised, retries included
    retries: int  # calls after a failed one
    dead_lettered: int  # events dead-lettered because this handler failed on them
    timeouts: int  # calls still running after the configured timeout
    calls: int
    p50_ms: float  # latency per call (a batch call is one call)
    p99_ms: float


class HandlerTally:
    """One worker's counts for one handler (only that worker writes them)."""

    __slots__ = ("calls", "dead_lettered", "errors", "events", "latency", "retries")

    def __init__(self) -> None:
        self.events = self.errors = self.retries = self.dead_lettered = self.calls = 0
        self.latency: dict[int, int] = {}  # latency bucket -> calls

    def timed(self, seconds: float) -> None:
        self.calls += 1
        bucket = _bucket(seconds)
        self.latency[bucket] = self.latency.get(bucket, 0) + 1


class WorkerState:
    """What one worker thread owns: its tallies, and the call it is in (for the watchdog)."""

    __slots__ = ("current", "dead_lettered", "reported_start", "skipped", "tallies",
                 "timed_out")

    def __init__(self) -> None:
        self.tallies: dict[str, HandlerTally] = {}
        self.skipped = 0  # events of tables without handlers
        self.dead_lettered = 0
        # [handler name, event or batch, start (perf_counter) or 0.0 when not in a call]
        self.current: list = ["", None, 0.0]
        # Written by the patrol thread only: calls past the timeout per handler, and the
        # start of the last one reported (a call is reported once).
        self.timed_out: dict[str, int] = {}
        self.reported_start = 0.0

    def tally(self, handler: Handler) -> HandlerTally:
        found = self.tallies.get(handler.name)
        if found is None:
            found = self.tallies[handler.name] = HandlerTally()
        return found


def merge_metrics(workers: Sequence[WorkerState]) -> dict[str, HandlerMetrics]:
    """Every worker's tallies summed per handler name."""
    names = sorted({n for w in workers for n in (*dict(w.tallies), *dict(w.timed_out))})
    out = {}
    for name in names:
        tallies = [w.tallies[name] for w in workers if name in w.tallies]
        latency: dict[int, int] = {}
        for t in tallies:
            for bucket, n in dict(t.latency).items():
                latency[bucket] = latency.get(bucket, 0) + n
        out[name] = HandlerMetrics(
            events=sum(t.events for t in tallies), errors=sum(t.errors for t in tallies),
            retries=sum(t.retries for t in tallies),
            dead_lettered=sum(t.dead_lettered for t in tallies),
            timeouts=sum(w.timed_out.get(name, 0) for w in workers),
            calls=sum(t.calls for t in tallies),
            p50_ms=_quantile_ms(latency, 0.50), p99_ms=_quantile_ms(latency, 0.99))
    return out


class Invoker:
    """Runs handlers on events for the lanes: the general path (several handlers, retries,
    the breaker, dead letters) and batch calls. The lanes keep the one-handler fast path."""

    def __init__(self, *, policy: ErrorPolicy, dead_letter: DeadLetter | None,
                 stop: threading.Event, halt: Callable[[BaseException | None], None],
                 handler_threads: int, timeout_seconds: float | None) -> None:
        self.policy = policy
        self._dead_letter = dead_letter
        self._stop = stop
        self._halt = halt
        self._handler_threads = handler_threads
        self.timeout_seconds = timeout_seconds
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def handle(self, slot: Slot, event: ChangeEvent, handlers: tuple[Handler, ...],
               first_error: BaseException | None, worker: WorkerState) -> bool:
        """One event through all its handlers; `slot.breaker` is its slot's key breaker
        (created here on the first dead letter). False when the dispatcher stopped and
        the event is not done."""
        key = (event.table, event.key)
        breaker = slot.breaker
        if breaker is not None and breaker.is_open(key):
            error = BreakerOpenError(event.table, event.key, breaker.threshold)
            return self.dead_letter_event(event, error, 0, worker)
        if not handlers:
            worker.skipped += 1
            return True
        if first_error is not None:
            outcomes = [self._retry(handlers[0], event, first_error, worker)]
        elif len(handlers) == 1:
            outcomes = [self.call(handlers[0], event, worker)]
        else:
            outcomes = self._fan_out(handlers, event, worker)
        failed = [(h, error, attempts) for h, (error, attempts)
                  in zip(handlers, outcomes, strict=True) if error is not None]
        for h, (error, _) in zip(handlers, outcomes, strict=True):
            if error is None:
                worker.tally(h).events += 1
        if not failed:
            if breaker is not None:
                breaker.record_success(key)
            return True
        for h, error, attempts in failed:
            error.add_note(
                f"binlake: handler {h.name!r} failed on {event.table} "
                f"{event.topic}[{event.partition}]@{event.offset} after {attempts} attempt(s)")
            worker.tally(h).dead_lettered += 1
        if len(failed) == 1:
            error = failed[0][1]
        else:
            error = BaseExceptionGroup(
                f"{len(failed)} handlers failed on {event.table}@{event.offset}",
                [error for _, error, _ in failed])
        mark_failed_handlers(error, [h.name for h, _, _ in failed])
        attempts = max(attempts for _, _, attempts in failed)
        if self.policy.strict or not isinstance(error, Exception):
            self._halt(error)
            return False
        if not self.dead_letter_event(event, error, attempts, worker):
            return False
        if self.policy.breaker_threshold:
            if breaker is None:
                breaker = slot.breaker = KeyBreaker(self.policy.breaker_threshold)
            if breaker.record_dead_letter(key):
                log.warning("breaker opened for %s key %r: later events of this key are "
                            "dead-lettered without retries", event.table, event.key)
        return True

    def handle_run(self, slot: Slot, batch: list[ChangeEvent], start: int,
                   handlers: tuple[Handler, ...], worker: WorkerState, done: list[int]) -> int:
        """The run of `batch[start]`'s table from `start` on (BATCH_MAX_EVENTS at most) through
        handlers of which some take batches; appends its offsets to `done`. Returns where
        the run ends, or -1 when the dispatcher stopped before all of it was done."""
        end = _same_table_end(batch, start, batch[start].table)
        run = batch[start:end]
        if self.handle_many(run, handlers, worker):
            done.extend([e.offset for e in run])
            return end
        # Replayed one at a time: only the events that fail dead-letter.
        for event in run:
            if not self.handle(slot, event, handlers, None, worker):
                return -1
            done.append(event.offset)
        return end

    def handle_many(self, events: list[ChangeEvent], handlers: tuple[Handler, ...],
                    worker: WorkerState) -> bool:
        """Consecutive events of one table through handlers of which some take batches:
        each handler gets them in order (a batch handler in one call). True when every
        handler succeeded; False means nothing is done yet, and the caller replays the
        events one at a time through `handle` (so only the failing ones dead-letter)."""
        if len(handlers) == 1:
            ok = self._run_all(handlers[0], events, worker)
        else:
            pool = self._handler_pool()
            futures = [pool.submit(self._run_all, h, events, worker) for h in handlers[1:]]
            first = self._run_all(handlers[0], events, worker)
            ok = all([first, *(f.result() for f in futures)])
        if ok:  # on a failure the replay counts each event once
            for h in handlers:
                worker.tally(h).events += len(events)
        return ok

    def _run_all(self, handler: Handler, events: list[ChangeEvent],
                 worker: WorkerState) -> bool:
        tally = worker.tally(handler)
        try:
            if handler.batch:
                self._timed(handler, events, tally, worker)
            else:
                for event in events:
                    self._timed(handler, event, tally, worker)
        except Exception:  # replayed event by event, errors counted there
            tally.errors += 1
            return False
        return True

    def call(self, handler: Handler, event: ChangeEvent,
             worker: WorkerState) -> tuple[BaseException | None, int]:
        try:
            self._timed(handler, [event] if handler.batch else event, worker.tally(handler),
                        worker)
        except BaseException as exc:
            return self._retry(handler, event, exc, worker)
        return None, 1

    def _timed(self, handler: Handler, arg: ChangeEvent | list[ChangeEvent],
               tally: HandlerTally, worker: WorkerState) -> None:
        current = worker.current
        current[0], current[1] = handler.name, arg
        began = current[2] = perf_counter()
        try:
            handler.fn(arg)
        finally:
            current[2] = 0.0
            tally.timed(perf_counter() - began)

    def _retry(self, handler: Handler, event: ChangeEvent, error: BaseException,
               worker: WorkerState) -> tuple[BaseException | None, int]:
        """Retry after `error` with backoff: (last error or None, attempts made)."""
        tally = worker.tally(handler)
        tally.errors += 1
        attempts = 1
        # Only ordinary exceptions are retried: SystemExit and friends mean stop.
        while isinstance(error, Exception) and attempts <= self.policy.max_retries:
            if self._stop.wait(self.policy.backoff(attempts)):
                raise Stopping
            attempts += 1
            tally.retries += 1
            try:
                self._timed(handler, [event] if handler.batch else event, tally, worker)
            except BaseException as exc:
                error = exc
                tally.errors += 1
            else:
                return None, attempts
        return error, attempts

    def _fan_out(self, handlers: tuple[Handler, ...], event: ChangeEvent,
                 worker: WorkerState) -> list[tuple[BaseException | None, int]]:
        """Run several handlers concurrently: the first inline, the rest on the pool. The
        pool's calls count on this worker's tallies (a lost update is one sample)."""
        pool = self._handler_pool()
        futures = [pool.submit(self.call, h, event, worker) for h in handlers[1:]]
        first = self.call(handlers[0], event, worker)
        return [first, *(future.result() for future in futures)]

    def _handler_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        self._handler_threads, thread_name_prefix="binlake-handler")
        return self._pool

    def dead_letter_event(self, event: ChangeEvent, error: BaseException, attempts: int,
                          worker: WorkerState) -> bool:
        try:
            if self._dead_letter is None:
                log.error("dead letter (no dead_letter callback) %s %s[%d]@%d after %d "
                          "attempt(s)", event.table, event.topic, event.partition,
                          event.offset, attempts, exc_info=error)
            else:
                self._dead_letter(event, error, attempts)
        except BaseException as exc:
            # Neither handled nor dead-lettered: it must not count as done.
            exc.add_note(f"binlake: dead_letter failed for {event.table} "
                         f"{event.topic}[{event.partition}]@{event.offset}")
            self._halt(exc)
            return False
        worker.dead_lettered += 1
        return True

    def watch(self, workers: Sequence[WorkerState]) -> None:
        """From the patrol: name each call running past the timeout, once per call."""
        if not self.timeout_seconds:
            return
        now = perf_counter()
        for worker in workers:
            name, arg, began = worker.current
            if began and now - began >= self.timeout_seconds and \
                    worker.reported_start != began:
                worker.reported_start = began
                worker.timed_out[name] = worker.timed_out.get(name, 0) + 1
                first = arg[0] if isinstance(arg, list) and arg else arg
                where = (f"{first.table} {first.topic}[{first.partition}]@{first.offset}"
                         if isinstance(first, ChangeEvent) else "?")
                log.warning("handler %r has been running for %.0fs on %s (timeout %ss): its "
                            "slot waits for it", name, now - began, where,
                            self.timeout_seconds)


def _same_table_end(batch: list[ChangeEvent], index: int, table: str) -> int:
    """Where the run of `table`'s events starting at `index` ends (BATCH_MAX_EVENTS at
    most): what one batch handler call receives."""
    end = min(len(batch), index + BATCH_MAX_EVENTS)
    for i in range(index + 1, end):
        if batch[i].table != table:
            return i
    return end


def _bucket(seconds: float) -> int:
    """Latency buckets 8 to an octave of microseconds (within about 9%)."""
    us = int(seconds * 1_000_000)
    bits = us.bit_length()
    if bits <= 4:
        return us
    return (bits << 3) | ((us >> (bits - 4)) & 7)


def _bucket_ms(bucket: int) -> float:
    if bucket < 16:
        return bucket / 1000
    bits, eighth = bucket >> 3, bucket & 7
    low = (8 | eighth) << (bits - 4)
    return (low + (1 << (bits - 4)) / 2) / 1000


def _quantile_ms(latency: dict[int, int], q: float) -> float:
    total = sum(latency.values())
    if not total:
        return 0.0
    rank, seen = q * total, 0
    for bucket in sorted(latency):
        seen += latency[bucket]
        if seen >= rank:
            return round(_bucket_ms(bucket), 3)
    return round(_bucket_ms(max(latency)), 3)
