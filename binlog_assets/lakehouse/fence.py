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
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from binlog_assets.formats.event import ChangeEvent
from binlog_assets.lakehouse.changelog import (
    ConcurrentPartitionWrite,
    PartitionWrite,
)

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
                version = self.writer.write(PartitionWrite(
                    events, raw, group_id=self.group, topic=self.topic,
                    partition=self.partition, end_offset=end_offset, check=self._check))
            except ConcurrentPartitionWrite as e:
                raise FencedRunError(f"{e}; this run writes nothing more") from e
        if version is None:
            raise FencedRunError(
                f"{self.topic}[{self.partition}]: another run wrote up to {end_offset} first")
        self._written(len(events), end_offset, version)

    def _written(self, rows: int, end_offset: int, version: int) -> None:
        self.version = version
        self.rows += rows
        self.expected = end_offset

    def _check(self, current: int | None) -> None:
        if current != self.expected:
            raise FencedRunError(
                f"{self.topic}[{self.partition}] was overtaken: its changelog checkpoint "
                f"is {current}, this run expected {self.expected}; it writes nothing more")


# One sink's range: (the sink, its events, their raw values, the end offset).
SinkRange = tuple[FencedChangelogSink, list[ChangeEvent], dict[int, bytes], int]


def write_together(ranges: Sequence[SinkRange]) -> list[FencedRunError | None]:
    """Each sink's range written as the sink writes it (`FencedChangelogSink.__call__`), all in
    one changelog commit of their shared writer, each under its partition's lock; per
    range, the error that fenced it (nothing of it is written) or None. A commit that
    conflicts with another writer's is tried once more, when each range's check finds
    whose checkpoint moved."""
    errors: list[FencedRunError | None] = [None] * len(ranges)
    todo: list[int] = []
    for i, (sink, _events, _raw, end_offset) in enumerate(ranges):
        if sink.expected is not None and end_offset <= sink.expected:
            continue  # a replay below the changelog's checkpoint: those rows are there already
        todo.append(i)
    if not todo:
        return errors
    writers = {id(ranges[i][0].writer) for i in todo}
    if len(writers) != 1:
        raise ValueError("ranges written together share one changelog writer")
    first = ranges[todo[0]][0]
    with ExitStack() as locks:
        # In one order, so that two callers never wait for each other's locks.
        for sink in sorted((ranges[i][0] for i in todo),
                           key=lambda s: (s.group, s.topic, s.partition)):
            locks.enter_context(partition_lock(sink.lakehouse, sink.group, sink.topic,
                                               sink.partition))
        parts = [_part(*ranges[i]) for i in todo]
        for attempt in (1, 2):
            try:
                outcomes = first.writer.write_many(parts)
                break
            except ConcurrentPartitionWrite as e:
                if attempt == 2 or len(parts) == 1:
                    for i in todo:
                        errors[i] = FencedRunError(f"{e}; this run writes nothing more")
                        errors[i].__cause__ = e
                    return errors
    for i, part, outcome in zip(todo, parts, outcomes, strict=True):
        sink, end_offset = ranges[i][0], ranges[i][3]
        if isinstance(outcome, FencedRunError):
            errors[i] = outcome
        elif isinstance(outcome, BaseException):
            raise outcome
        elif outcome is None:
            errors[i] = FencedRunError(
                f"{sink.topic}[{sink.partition}]: another run wrote up to {end_offset} first")
        else:
            sink._written(len(part.events), end_offset, outcome)
    return errors


def _part(sink: FencedChangelogSink, events: list[ChangeEvent], raw: dict[int, bytes],
          end_offset: int) -> PartitionWrite:
    if sink.expected is not None:
        events = [e for e in events if e.offset >= sink.expected]
    return PartitionWrite(events, raw, sink.group, sink.topic, sink.partition, end_offset,
                          sink._check)
