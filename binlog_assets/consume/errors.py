"""What happens when a handler fails: retries, dead letters, the per-key breaker, strict mode.

Invariant 6 says bad input never stops the world silently. `ErrorPolicy` is the one
place that says how hard to try: a failing handler is retried with exponential backoff,
then the event is handed to the run's dead-letter callback (which publishes it with its
coordinates) and counts as done. A `KeyBreaker` keeps one poison row from holding its
lane through retry after retry: once a key has dead-lettered `breaker_threshold` events
in a row, its later events go straight to the dead letters. In strict mode the first
exhausted failure stops the dispatcher instead, and the event is never marked done, so
the committed offset stays before it. The retry loop itself lives in `invoke.py`, which
calls the handlers.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from binlog_assets.consume import defaults
from binlog_assets.consume.lineage import UnorderedEventError
from binlog_assets.formats.event import (
    ChangeEvent,
    SnapshotPending,
    SourceUnavailableError,
    UnknownSchemaError,
)

# Why an event was dead-lettered; the run writes this next to the error in the DLQ record.
REASON_RETRIES_EXHAUSTED = "retries_exhausted"
REASON_BREAKER_OPEN = "breaker_open"

DeadLetter = Callable[[ChangeEvent, BaseException, int], None]
"""`dead_letter(event, error, attempts)`: publish the event and its error; the event is
done once this returns. It is called from lane threads, one call per dead-lettered event.
An exception from it stops the dispatcher: an event neither handled nor dead-lettered
must not be committed past."""


@dataclass(frozen=True, slots=True)
class ErrorPolicy:
    """How a failing handler is retried and when its event is given up on.

    `max_retries` retries follow the first attempt, waiting `backoff_initial`, then twice
    that, up to `backoff_max` seconds. `breaker_threshold` consecutive dead letters of one
    key open that key's breaker for the rest of the run (0 turns the breaker off).
    `strict` stops the dispatcher on the first exhausted failure instead of dead-lettering.
    """

    max_retries: int = defaults.MAX_RETRIES
    backoff_initial: float = 0.05
    backoff_max: float = 2.0
    strict: bool = False
    breaker_threshold: int = 5

    def __post_init__(self) -> None:
        # A configuration error fails at load time with a message naming the field.
        _require_int("max_retries", self.max_retries, minimum=0)
        _require_int("breaker_threshold", self.breaker_threshold, minimum=0)
        _require_seconds("backoff_initial", self.backoff_initial)
        _require_seconds("backoff_max", self.backoff_max)
        if self.backoff_max < self.backoff_initial:
            raise ValueError(
                f"ErrorPolicy.backoff_max ({self.backoff_max}) must be >= "
                f"backoff_initial ({self.backoff_initial})"
            )
        if not isinstance(self.strict, bool):
            raise ValueError(f"ErrorPolicy.strict must be a bool, got {self.strict!r}")

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1-based)."""
        return min(self.backoff_max, self.backoff_initial * 2 ** (retry - 1))


class PartitionStopped(RuntimeError):
    """A run stopped its partition at a record it may not pass: what came before the
    record is committed, nothing past it, and the next run starts at it."""


class StrictModeFailure(PartitionStopped):
    """A strict run met a bad message; nothing past it was committed."""


def stops_partition(error: BaseException, strict: bool) -> bool:
    """Whether a decode failure stops the partition at its record (else it is
    dead-lettered): in strict mode, when the registry cannot be reached, for an event
    that cannot be placed in its source's order, and for a schema id the registry does
    not know unless the config dead-letters those."""
    if isinstance(error, SourceUnavailableError | UnorderedEventError | SnapshotPending):
        return True
    return strict or (isinstance(error, UnknownSchemaError) and not error.dead_letter)


def partition_stopped(error: BaseException, topic: str, partition: int, offset: int,
                      committed: int) -> Exception:
    """The error a run raises after stopping `topic[partition]` at `offset` for `error`
    and committing up to `committed`: it names the record and says what to do."""
    where = (f"{topic}[{partition}] stopped at offset {offset}, committed up to "
             f"{committed}, nothing past it")
    if isinstance(error, SourceUnavailableError):
        return SourceUnavailableError(f"{error}; {where}: run again once it answers")
    if isinstance(error, UnorderedEventError):
        return PartitionStopped(f"{error} ({where})")
    if isinstance(error, UnknownSchemaError):
        return PartitionStopped(
            f"{error}; {where}. A wrong registry or a lost store: point schema_registry.url "
            f"at the registry the producers write to, or restore its store, and run again; "
            f"once those schemas are known to be gone, set schema_registry "
            f"`binlake.unknown.schema.id: dead-letter` to dead-letter such records")
    return StrictModeFailure(f"undecodable message at {topic}[{partition}]@{offset} in "
                             f"strict mode ({where}): {error}")


class BreakerOpenError(Exception):
    """Handed to `dead_letter` for an event skipped because its key's breaker is open."""

    reason = REASON_BREAKER_OPEN

    def __init__(self, table: str, key: tuple, threshold: int) -> None:
        super().__init__(
            f"breaker open for {table} key {key!r}: {threshold} events of this key were "
            f"dead-lettered in a row, so later ones are dead-lettered without retries"
        )
        self.table = table
        self.key = key


class DispatcherStopped(RuntimeError):
    """Raised by submit after close() or a strict-mode failure; `__cause__` is the failure."""


def dead_letter_reason(error: BaseException) -> str:
    """The reason to record with a dead letter: `breaker_open` or `retries_exhausted`."""
    return getattr(error, "reason", REASON_RETRIES_EXHAUSTED)


class KeyBreaker:
    """Counts consecutive dead letters per key and opens the key after `threshold`.

    One instance belongs to one key slot. A key always maps to the same slot, so the slot's
    worker is the only caller and no lock is needed. An open key stays open for the rest
    of the run: a bounded run is short, and the next run starts with every key closed.
    """

    __slots__ = ("_open", "_streak", "threshold")

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self._streak: dict[Hashable, int] = {}
        self._open: set[Hashable] = set()

    def is_open(self, key: Hashable) -> bool:
        return key in self._open

    def record_success(self, key: Hashable) -> None:
        self._streak.pop(key, None)

    def record_dead_letter(self, key: Hashable) -> bool:
        """Count one dead letter; True when this one opened the key's breaker."""
        streak = self._streak.get(key, 0) + 1
        if streak >= self.threshold:
            self._streak.pop(key, None)
            self._open.add(key)
            return True
        self._streak[key] = streak
        return False

    def open_keys(self) -> frozenset[Hashable]:
        return frozenset(self._open)


def _require_int(field: str, value: object, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"ErrorPolicy.{field} must be an integer >= {minimum}, got {value!r}")


def _require_seconds(field: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ValueError(f"ErrorPolicy.{field} must be a number of seconds >= 0, got {value!r}")


_FAILED_HANDLERS = "binlake_failed_handlers"


def mark_failed_handlers(error: BaseException, names: list[str]) -> None:
    """Name the handlers that failed on an event, for its dead letter's headers."""
    setattr(error, _FAILED_HANDLERS, tuple(names))


def failed_handlers(error: BaseException) -> tuple[str, ...]:
    """The handlers `mark_failed_handlers` named on `error` (none for other errors)."""
    return getattr(error, _FAILED_HANDLERS, ())
