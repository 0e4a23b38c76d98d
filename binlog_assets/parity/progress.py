"""Has a replica applied past a source binlog position P? Known for an idle table too.

A replica records the changelog version it applied, not a binlog position, and an idle
table's topic carries nothing after P. So the answer is put together from what each
part records:

1. the changelog holds everything Kafka held of the source when the wait began: every
   partition of the source's topics has its changelog checkpoint at the high watermark
   read then (a fixed goal: a busy partition's moves on);
2. the replica applied every changelog commit up to the version that held them that
   touches its tables (the commits' surveys name their tables; a commit without a
   survey counts as touching);
3. everything the source wrote before P is in the changelog: either the changelog's
   commits of the source's topics reached a position at or past P (Debezium publishes
   in binlog order), or the binlog between the last position they reached and P holds
   no row event of the replica's tables (`SHOW BINLOG EVENTS`): the table was idle.
   Positions compare with their lineage (`parity/lineage.py`): P is placed in the
   source's lineages first, and has no place while the changelog has not reached the
   server's binlog (a failover not consumed yet).

Under a running workload 3 holds by its first half within a consumer run or two; on an
idle source, by its second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from binlog_assets.formats.event import FIRST_LINEAGE
from binlog_assets.lakehouse.changelog import changelog_uri
from binlog_assets.lakehouse.changelog_rows import commit_doc
from binlog_assets.lakehouse.delta_log import delta_rs_uri
from binlog_assets.parity.lake import (
    applied_version,
    changelog_version,
    high_watermarks,
    partitions_behind,
    reached_position,
)
from binlog_assets.parity.lineage import place_position
from binlog_assets.parity.source import BinlogPosition, binlog_tables_between

if TYPE_CHECKING:
    import pymysql
    from deltalake import DeltaTable

    from binlog_assets.config import PipelineConfig, SourceConfig
    from binlog_assets.lakehouse.replica.routes import ReplicaRoute


@dataclass(frozen=True)
class Progress:
    """Whether the replica is past P, and what says so (or what it waits for)."""

    past: bool
    reason: str
    lineage: int | None = None  # the lineage P was placed in, once known


@dataclass(frozen=True)
class CheckedSource:
    """One source of a replica under a parity check: the pipeline, the replica's route
    over this source's tables, the source and a connection to it, and the Kafka client
    config and consumer group its changelog partitions are read with."""

    pipeline: PipelineConfig
    route: ReplicaRoute
    source: SourceConfig
    db: pymysql.Connection
    kafka_conf: dict
    group: str


@dataclass
class PastWaiter:
    """Looks whether the replica is past P, against fixed targets: the high watermarks
    read at the first look and the changelog version at which the changelog held them.
    Read anew at every look, a busy partition's high watermark would always be ahead,
    and the wait would never end under a running workload."""

    checked: CheckedSource
    position: BinlogPosition
    _targets: dict | None = None
    _version: int | None = None
    _lineage: int | None = None

    def look(self) -> Progress:
        pipeline, route, source = self.checked.pipeline, self.checked.route, self.checked.source
        db, group = self.checked.db, self.checked.group
        if self._targets is None:
            self._targets = high_watermarks(self.checked.kafka_conf, group, source)
        behind = partitions_behind(pipeline, group, self._targets)
        if behind:
            return Progress(False, f"the changelog lags Kafka: {behind}")
        if self._version is None:
            self._version = changelog_version(pipeline)
        if self._version is None:
            return Progress(False, "no changelog yet")
        applied = applied_version(pipeline, route.replica)
        pending = unapplied_commits(pipeline, route, applied, self._version)
        if pending:
            return Progress(False, f"the replica has not applied changelog versions "
                                   f"{pending[:10]}")
        if self._lineage is None:
            placed = place_position(pipeline, source, db, self.position, list(self._targets),
                                    group)
            if placed.lineage is None:
                self._targets = self._version = None
                return Progress(False, placed.reason)
            self._lineage = placed.lineage
        reached = reached_position(pipeline, source, self._version)
        target = (self._lineage, self.position.file, self.position.pos)
        if reached is not None and reached >= target:
            return Progress(True, f"the changelog reached binlog {_label(reached)}, past "
                                  f"the snapshot's {_label(target)}", self._lineage)
        # The binlog between can be read only when both ends are of the server's binlog.
        between = (binlog_tables_between(db, None if reached is None else reached[1:],
                                         self.position)
                   if reached is None or reached[0] == self._lineage else None)
        ours = None if between is None else sorted(t for t in between if route.matches(t))
        if between is None or ours:
            # Debezium had not published them when the targets were read: read anew.
            self._targets = self._version = None
            return Progress(False, f"changes of {ours} between binlog {_label(reached)} and "
                                   f"{_label(target)} are not in the changelog yet"
                            if ours else f"the binlog from {_label(reached)} to "
                                         f"{_label(target)} cannot be read or is too long")
        return Progress(True, f"the changelog reached binlog {_label(reached)} and the "
                              f"binlog up to the snapshot's {_label(target)} holds no "
                              f"change of the replica's tables", self._lineage)


def progress(position: BinlogPosition, *, checked: CheckedSource) -> Callable[[], Progress]:
    """A look at the three conditions above, for `wait_past`."""
    return PastWaiter(checked=checked, position=position).look


def wait_past(look: Callable[[], Progress], timeout: float, poll: float = 0.5) -> Progress:
    """`look` again every `poll` seconds until it says past, or `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        seen = look()
        if seen.past or time.monotonic() >= deadline:
            return seen
        time.sleep(poll)


def unapplied_commits(pipeline: PipelineConfig, route: ReplicaRoute, applied: int | None,
                      version: int) -> list[int]:
    """Changelog versions after `applied` up to `version` touching the replica's tables."""
    from deltalake import DeltaTable

    first = 0 if applied is None else applied + 1
    if first > version:
        return []
    # The latest log: one loaded at a version numbers its history wrongly (delta-rs).
    log = DeltaTable(delta_rs_uri(changelog_uri(pipeline)))
    pending = []
    for commit in log.history(log.version() - first + 1):
        if not first <= commit["version"] <= version or \
                commit.get("operation") == "CREATE TABLE":
            continue
        doc = commit_doc(commit.get("userMetadata"))
        survey = doc.get("survey")
        tables = (_changed_tables(log, commit["version"]) if survey is None
                  else {entry[0] for entry in survey})
        if any(route.matches(t) for t in tables):
            pending.append(commit["version"])
    return sorted(pending)


def _changed_tables(log: DeltaTable, version: int) -> frozenset[str]:
    """Tables of the rows in the change feed of a commit without a survey (a property
    change, a compaction, a delete by hand): the builder surveys those rows, finds none of
    an idle replica's and leaves its applied version where it was, so only a commit with
    the replica's rows is one it must apply."""
    import pyarrow as pa

    key = (log.metadata().id, version)
    tables = _CHANGED_TABLES.get(key)
    if tables is None:
        rows = pa.table(log.load_cdf(starting_version=version, ending_version=version,
                                     columns=["table"]).read_all())
        tables = frozenset(t for t in rows.column("table").unique().to_pylist()
                           if t is not None)
        if len(_CHANGED_TABLES) >= 1024:
            _CHANGED_TABLES.clear()
        _CHANGED_TABLES[key] = tables
    return tables


# (changelog table id, version) -> the tables its change feed holds: a commit never
# changes, and a parity wait looks again every half second.
_CHANGED_TABLES: dict[tuple[str, int], frozenset[str]] = {}


def _label(position: tuple[int, int, int] | None) -> str:
    if position is None:
        return "start"
    lineage, file, pos = position
    where = f"{file:06d}:{pos}"
    return where if lineage <= FIRST_LINEAGE else f"{where} (lineage {lineage})"
