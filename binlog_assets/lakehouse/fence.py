"""One owner per partition (invariant 4): the changelog sink that refuses to write once
another run has moved the partition's checkpoint.

Before each changelog write the sink checks that the changelog's transaction state for
its partition is still where this run left it; if another run moved it, this one writes
nothing more and fails with a clear message. The check reads the state the write reads
(`ChangelogWriter.write`'s `check`), under a file lock per partition when the lakehouse
is a local path, so no other process can commit in between (delta-rs does not refuse a
transaction version it already holds, delta-rs #2580). On object storage there is no such
lock; there delta-rs commits with conditional writes (`AWS_CONDITIONAL_PUT=etag`, S3's
`If-None-Match`; without it or a locking provider delta-rs refuses to write to S3), and
its conflict check refuses a commit whose transaction id (group + topic-partition)
another commit took since it read the table: of two racing runs, one is fenced there.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from binlog_assets.formats.event import ChangeEvent
from binlog_assets.lakehouse.changelog import ConcurrentPartitionWrite

if TYPE_CHECKING:
    from binlog_assets.lakehouse.changelog import ChangelogWriter


class FencedRunError(RuntimeError):
    """Another run moved this partition's checkpoint: this run must not write."""


@contextmanager
def partition_lock(lakehouse: str, group: str, topic: str, partition: int) -> Iterator[None]:
    """An exclusive lock across processes for one partition's changelog writes (local
    lakehouse paths only; a no-op for object storage)."""
    if "://" in lakehouse:
        yield
        return
    locks = Path(lakehouse) / "_binlake_locks"
    locks.mkdir(parents=True, exist_ok=True)
    # Topic names are [A-Za-z0-9._-]; the group is sanitized the same way.
    safe_group = "".join(c if c.isalnum() or c in "._-" else "_" for c in group)
    with open(locks / f"{safe_group}__{topic}__{partition}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class FencedChangelogSink:
    """Writes each contiguous range to the changelog, after checking nobody else did."""

    def __init__(self, writer: ChangelogWriter, *, group: str, topic: str, partition: int,
                 expected: int | None, lakehouse: str) -> None:
        self.writer = writer
        self.lakehouse = lakehouse
        self.group, self.topic, self.partition = group, topic, partition
        self.expected = expected
        self.version: int | None = None
        self.rows = 0

    def __call__(self, events: list[ChangeEvent], raw: dict[int, bytes],
                 end_offset: int) -> None:
        if self.expected is not None and end_offset <= self.expected:
            return  # a replay below the changelog's checkpoint: those rows are there already
        if self.expected is not None:
            events = [e for e in events if e.offset >= self.expected]
        with partition_lock(self.lakehouse, self.group, self.topic, self.partition):
            try:
                version = self.writer.write(events, raw, group_id=self.group,
                                            topic=self.topic, partition=self.partition,
                                            end_offset=end_offset, check=self._check)
            except ConcurrentPartitionWrite as e:
                raise FencedRunError(f"{e}; this run writes nothing more") from e
        if version is None:
            raise FencedRunError(
                f"{self.topic}[{self.partition}]: another run wrote up to {end_offset} first")
        self.version = version
        self.rows += len(events)
        self.expected = end_offset

    def _check(self, current: int | None) -> None:
        if current != self.expected:
            raise FencedRunError(
                f"{self.topic}[{self.partition}] was overtaken: its changelog checkpoint "
                f"is {current}, this run expected {self.expected}; it writes nothing more")
