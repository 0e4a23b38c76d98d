"""Has a replica applied past a source binlog position P? Known for an idle table too.

A replica records the changelog version it applied, not a binlog position, and an idle
table's topic carries nothing after P. So the answer is put together from what each
part records:

1. the changelog holds everything Kafka holds of the source: every partition of the
   source's topics has its changelog checkpoint at its high watermark, read now;
2. the replica applied every changelog commit that touches its tables (the commits'
   surveys name their tables; a commit without a survey counts as touching);
3. everything the source wrote before P is in the changelog: either the changelog's
   commits of the source's topics reached a position at or past P (Debezium publishes
   in binlog order), or the binlog between the last position they reached and P holds
   no row event of the replica's tables (`SHOW BINLOG EVENTS`): the table was idle.

Under a running workload 3 holds by its first half within a consumer run or two; on an
idle source, by its second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from binlog_assets.lakehouse.changelog import changelog_uri, commit_doc
from binlog_assets.lakehouse.delta_log import delta_rs_uri
from binlog_assets.parity.lake import (
    applied_version,
    changelog_version,
    partitions_behind,
    reached_position,
)
from binlog_assets.parity.source import BinlogPosition, binlog_tables_between

if TYPE_CHECKING:
    import pymysql

    from binlog_assets.config import PipelineConfig, SourceConfig
    from binlog_assets.lakehouse.routing import ReplicaRoute


@dataclass(frozen=True)
class Progress:
    """Whether the replica is past P, and what says so (or what it waits for)."""

    past: bool
    reason: str


def progress(config: PipelineConfig, route: ReplicaRoute, source: SourceConfig,
             db: pymysql.Connection, position: BinlogPosition, kafka_conf: dict,
             group: str) -> Progress:
    """One look at the three conditions above."""
    behind = partitions_behind(config, kafka_conf, group, source)
    if behind:
        return Progress(False, f"the changelog lags Kafka: {behind}")
    version = changelog_version(config)
    if version is None:
        return Progress(False, "no changelog yet")
    applied = applied_version(config, route.replica)
    pending = unapplied_commits(config, route, applied, version)
    if pending:
        return Progress(False, f"the replica has not applied changelog versions {pending}")
    reached = reached_position(config, source, version)
    target = (position.file, position.pos)
    if reached is not None and reached >= target:
        return Progress(True, f"the changelog reached binlog {_label(reached)}, past the "
                              f"snapshot's {_label(target)}")
    between = binlog_tables_between(db, reached, position)
    if between is None:
        return Progress(False, f"the binlog from {_label(reached)} to {_label(target)} "
                               f"cannot be read or is too long to scan")
    ours = sorted(t for t in between if route.matches(t))
    if ours:
        return Progress(False, f"changes of {ours} between binlog {_label(reached)} and "
                               f"{_label(target)} are not in the changelog yet")
    return Progress(True, f"the changelog reached binlog {_label(reached)} and the binlog "
                          f"up to the snapshot's {_label(target)} holds no change of the "
                          f"replica's tables")


def wait_past(look: Callable[[], Progress], timeout: float, poll: float = 0.5) -> Progress:
    """`look` again every `poll` seconds until it says past, or `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        seen = look()
        if seen.past or time.monotonic() >= deadline:
            return seen
        time.sleep(poll)


def unapplied_commits(config: PipelineConfig, route: ReplicaRoute, applied: int | None,
                      version: int) -> list[int]:
    """Changelog versions after `applied` up to `version` touching the replica's tables."""
    from deltalake import DeltaTable

    first = 0 if applied is None else applied + 1
    if first > version:
        return []
    log = DeltaTable(delta_rs_uri(changelog_uri(config)), version=version)
    pending = []
    for commit in log.history(version - first + 1):
        if commit["version"] < first or commit.get("operation") == "CREATE TABLE":
            continue
        doc = commit_doc(commit.get("userMetadata"))
        survey = doc.get("survey")
        if survey is None or any(route.matches(entry[0]) for entry in survey):
            pending.append(commit["version"])
    return sorted(pending)


def _label(position: tuple[int, int] | None) -> str:
    return "start" if position is None else f"{position[0]:06d}:{position[1]}"
