"""The consume settings' defaults, in one place: the config (`sources[]`), `RunSettings`
and the lanes all read them from here."""

from __future__ import annotations

LANES = 16  # events of different ordering keys handled at once
KEY_SLOTS_PER_LANE = 8
# Threads serving the lanes when a run names none: one per lane, up to this many.
MAX_DEFAULT_WORKERS = 64
MAX_IN_FLIGHT = 10_000
MAX_RETRIES = 3
HANDLER_TIMEOUT_SECONDS = 60.0
COMMIT_TIMEOUT_SECONDS = 60.0  # an offset commit that takes longer fails the run
COMMIT_INTERVAL_SECONDS = 5.0  # a running consume commits its done offsets this often
BATCH_SIZE = 1000  # records one consume call asks the broker for, at most
# A run that names no source (a `BoundedRun` outside the config) dead-letters here.
UNNAMED_SOURCE = "default"


def default_workers(lanes: int) -> int:
    """The threads serving `lanes` lanes when a run names no `workers`."""
    return min(lanes, MAX_DEFAULT_WORKERS)


def dead_letter_topic(source: str) -> str:
    """A source's dead-letter topic unless its config names one."""
    return f"binlake.dlq.{source}"
