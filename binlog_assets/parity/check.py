"""The parity check of one replica: its source tables' chunks summed by the source server
inside consistent snapshots, the same chunks of the replica summed over its live rows
once it has applied past the snapshots, a differing chunk checked again, and a report.

A chunk that differs is taken again in a new snapshot, and the replica read again once
past that snapshot: a row changed between the two reads would otherwise look like a
difference. Only a chunk that differs twice is reported, with a sample of its keys
(the source's keys and row CRCs of that chunk against the replica's). A table without
a key is one chunk, compared with its append-only replica's log replayed (`replay.py`).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from binlog_assets.formats.event import FIRST_LINEAGE
from binlog_assets.lakehouse.replica.routes import ReplicaRoute, replica_route
from binlog_assets.parity.canonical import Fingerprint
from binlog_assets.parity.lake import replica_rows, row_positions
from binlog_assets.parity.progress import CheckedSource, Progress, progress, wait_past
from binlog_assets.parity.source import (
    ChunkChecksum,
    SourceTable,
    chunk_again,
    chunk_checksums,
    connect,
    row_crcs,
    source_tables,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import pymysql

    from binlog_assets.config import PipelineConfig, SourceConfig
    from binlog_assets.parity.chunks import Key, KeyRange
    from binlog_assets.parity.source import BinlogPosition


class NotCheckable(Exception):
    """The replica cannot be checked as configured; says why."""


@dataclass
class Mismatch:
    table: str
    key_range: str
    source_rows: int
    replica_rows: int
    keys: list[str]  # a sample: `key: missing in replica` / `extra in replica` / `differs`
    bounds: KeyRange | None = None  # the chunk's keys; None: a log of changes, replayed


@dataclass
class ParityReport:
    replica: str
    tables: list[str] = field(default_factory=list)
    chunks: int = 0
    source_rows: int = 0
    replica_rows: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    rechecked: int = 0  # chunks that differed once and were taken again
    skipped_columns: dict[str, list[str]] = field(default_factory=dict)
    single_chunk_tables: list[str] = field(default_factory=list)
    snapshot: str = ""
    progress: str = ""
    applied_past: bool = True
    seconds: float = 0.0
    source_seconds: float = 0.0
    replica_seconds: float = 0.0
    wait_seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.applied_past and not self.mismatches

    def sample_keys(self, limit: int) -> list[str]:
        return [f"{m.table} {k}" for m in self.mismatches for k in m.keys][:limit]

    def summary(self) -> str:
        if not self.applied_past:
            return (f"not checked: the replica did not apply past the source's snapshot "
                    f"({self.progress})")
        if self.mismatches:
            return (f"{len(self.mismatches)} of {self.chunks} chunks differ "
                    f"({self.source_rows} source rows, {self.replica_rows} replica rows); "
                    f"keys: {', '.join(self.sample_keys(5))}")
        return (f"equal: {self.chunks} chunks, {self.source_rows} rows of "
                f"{len(self.tables)} table(s)")


def check_replica(pipeline: PipelineConfig, replica: str, kafka_conf: dict, group: str,
                  log: Callable[[str], None] = lambda _: None) -> ParityReport:
    """Check one replica against each source table it reads."""
    began = time.monotonic()
    route = replica_route(pipeline, replica)
    report = ParityReport(replica)
    for source in sources_of(pipeline, replica):
        if source.connection is None:
            raise NotCheckable(f"source {source.name!r} has no `connection`")
        db = connect(source.connection)
        try:
            checked = CheckedSource(pipeline, own_route(route, source), source, db, kafka_conf,
                                    group)
            _check_source(route, report, log, checked=checked)
        finally:
            db.close()
    report.seconds = time.monotonic() - began
    return report


def sources_of(pipeline: PipelineConfig, replica: str) -> list[SourceConfig]:
    return [s for s in pipeline.sources if any(t.replica == replica for t in s.tables)]


def replica_sources(pipeline: PipelineConfig, replica: str, table: str = ""
                    ) -> Iterator[tuple[SourceConfig, pymysql.Connection, SourceTable]]:
    """Each source table `replica` reads (`table`: that one only, `db.table`), with its
    source and that source's read-only connection, open while its tables are taken."""
    route = replica_route(pipeline, replica)
    for source in sources_of(pipeline, replica):
        if source.connection is None:
            raise ValueError(f"source {source.name!r} has no `connection` to read from")
        db = connect(source.connection)
        try:
            for found in source_tables(db, own_route(route, source)):
                if not table or found.name == table:
                    yield source, db, found
        finally:
            db.close()


def own_route(route: ReplicaRoute, source: SourceConfig) -> ReplicaRoute:
    """The route restricted to the table configs of one source (each has its server)."""
    from binlog_assets.lakehouse.replica.routes import _route

    return _route(route.replica, [t for t in source.tables if t.replica == route.replica])


def _check_source(route: ReplicaRoute, report: ParityReport, log: Callable[[str], None], *,
                  checked: CheckedSource) -> None:
    """The source's tables of the replica (`route`) checked, chunk by chunk."""
    pipeline, db = checked.pipeline, checked.db
    settings = pipeline.parity
    tables = source_tables(db, checked.route)
    if not tables:
        raise NotCheckable(f"no source table of {checked.source.name!r} matches the "
                           f"replica's table configs")
    began = time.monotonic()
    taken: dict[str, list[ChunkChecksum]] = {}
    for table in tables:
        report.tables.append(table.name)
        if table.skipped:
            report.skipped_columns[table.name] = list(table.skipped)
        if not table.ranged:
            report.single_chunk_tables.append(table.name)
        taken[table.name] = list(chunk_checksums(db, table, settings.chunk_rows,
                                                 settings.pause_seconds))
    report.source_seconds += time.monotonic() - began
    last = max(c.position for chunks in taken.values() for c in chunks)
    report.snapshot = f"{last.name}:{last.pos}"
    log(f"{route.replica}: {sum(map(len, taken.values()))} source chunks in "
        f"{report.source_seconds:.1f}s, snapshot up to {report.snapshot}")

    seen = _wait(last, report, checked=checked)
    if not seen.past:
        return
    for table in tables:
        chunks = taken[table.name]
        if _is_log(route, table):
            _check_log(table, chunks[0], report, checked=checked)
            continue
        began = time.monotonic()
        rows = replica_rows(pipeline, route.replica, table)
        uppers = [c.key_range.upper for c in chunks]
        replica = rows.fingerprints(uppers)
        report.replica_seconds += time.monotonic() - began
        report.chunks += len(chunks)
        report.source_rows += sum(c.rows for c in chunks)
        report.replica_rows += sum(f.rows for f in replica)
        differing = [i for i, (c, f) in enumerate(zip(chunks, replica, strict=True))
                     if not _equal(c, f)]
        for i in differing:
            report.rechecked += 1
            mismatch = _recheck(table, chunks, i, report, checked=checked)
            if mismatch is not None:
                report.mismatches.append(mismatch)
                log(f"{route.replica}: {table.name} chunk {mismatch.key_range} differs: "
                    f"{mismatch.keys[:5]}")


def _is_log(route: ReplicaRoute, table: SourceTable) -> bool:
    """Whether the replica keeps the table as a log of changes (README: tables without a
    primary key): `replica_mode: append`, or no key and no key_columns."""
    return route.replica_mode == "append" or not table.key


def _check_log(table: SourceTable, chunk: ChunkChecksum, report: ParityReport, *,
               checked: CheckedSource) -> None:
    """A keyless table, one chunk: its rows against the replica's log replayed as a
    multiset; taken again when they differ, as a keyed chunk is."""
    from binlog_assets.lakehouse.replica.arrow_apply import NeedsSpark
    from binlog_assets.parity.replay import replayed

    db = checked.db

    def replay():  # noqa: ANN202
        began = time.monotonic()
        try:
            out = replayed(checked.pipeline, checked.route.replica, table)
        except NeedsSpark as exc:
            raise NotCheckable(f"{table.name}: an update's before-image in the changelog "
                               f"cannot be typed as the replica's: {exc}") from exc
        report.replica_seconds += time.monotonic() - began
        return out

    log = replay()
    report.chunks += 1
    report.source_rows += chunk.rows
    report.replica_rows += log.fingerprint().rows
    if _equal(chunk, log.fingerprint()) and not log.unmatched:
        return
    report.rechecked += 1
    again = chunk_again(db, table, chunk.key_range)
    if not _wait(again.position, report, checked=checked).past:
        return
    log = replay()
    if _equal(again, log.fingerprint()) and not log.unmatched:
        return
    source_rows, _ = row_crcs(db, table, chunk.key_range)
    ours = Counter(source_rows.values())
    missing = sum((ours - log.rows).values())
    extra = sum((log.rows - ours).values())
    keys = [*(f"{missing} source row(s) missing from the replayed log",) * bool(missing),
            *(f"{extra} replayed row(s) not in the source",) * bool(extra), *log.unmatched]
    report.mismatches.append(Mismatch(table.name, "all rows (a log of changes, replayed)",
                                      again.rows, log.fingerprint().rows,
                                      keys[:checked.pipeline.parity.sample_keys]))


def _wait(position: BinlogPosition, report: ParityReport, *, checked: CheckedSource
          ) -> Progress:
    began = time.monotonic()
    seen = wait_past(progress(position, checked=checked), checked.pipeline.parity.wait_seconds)
    report.wait_seconds += time.monotonic() - began
    report.progress = seen.reason
    report.applied_past = report.applied_past and seen.past
    return seen


def _equal(chunk: ChunkChecksum, replica: Fingerprint) -> bool:
    return (chunk.rows, chunk.total, chunk.xor) == (replica.rows, replica.total, replica.xor)


def _recheck(table: SourceTable, chunks: list[ChunkChecksum], index: int,
             report: ParityReport, *, checked: CheckedSource) -> Mismatch | None:
    """The chunk taken again: None when it now agrees, else what differs (keys named)."""
    pipeline, route = checked.pipeline, checked.route
    key_range = chunks[index].key_range
    # The row CRCs and their fingerprint from one snapshot: an aggregate and row CRCs
    # taken apart would see different rows under a running workload.
    source_crcs, position = row_crcs(checked.db, table, key_range)
    again = Fingerprint.of(list(source_crcs.values()))
    seen = _wait(position, report, checked=checked)
    if not seen.past:
        return None
    uppers = [c.key_range.upper for c in chunks]
    rows = replica_rows(pipeline, route.replica, table)
    replica = rows.fingerprints(uppers)[index]
    if again == replica:
        return None
    # A row the stream changed after the snapshot may differ from it: not a mismatch
    # (and a damaged row a later change rewrote is repaired by it).
    at = (seen.lineage or FIRST_LINEAGE, position.file, position.pos)
    later = {k for k, p in row_positions(pipeline, route.replica, table).items() if p >= at}
    keys = differing_keys(source_crcs, rows.in_chunk(uppers, index),
                          pipeline.parity.sample_keys, later)
    if not keys:
        return None
    return Mismatch(table.name, key_range.label(), again.rows, replica.rows, keys, key_range)


def differing_keys(source: dict[Key, int], replica: dict[Key, list[int]], limit: int,
                   later: set[Key] | frozenset[Key] = frozenset()) -> list[str]:
    """A sample of the keys whose rows differ: missing in the replica, extra in it, or
    with other values (a key the replica holds twice counts as differing); keys in
    `later` (changed after the snapshot) are left out."""
    out = []
    for key in sorted(source.keys() | replica.keys(), key=_sortable):
        if key in later:
            continue
        theirs = replica.get(key)
        if key not in source:
            out.append(f"{_key_text(key)}: extra in replica")
        elif theirs is None:
            out.append(f"{_key_text(key)}: missing in replica")
        elif theirs != [source[key]]:
            out.append(f"{_key_text(key)}: differs")
        if len(out) >= limit:
            break
    return out


def _sortable(key: Key) -> tuple:
    return tuple((v is None, str(type(v)), v) if v is not None else (True, "", 0)
                 for v in key)


def _key_text(key: Key) -> str:
    return str(key[0]) if len(key) == 1 else str(tuple(key))
