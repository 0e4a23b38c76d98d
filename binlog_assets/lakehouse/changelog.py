"""The bronze changelog: every change event, appended once, with its Kafka coordinates, in
one Delta table written by delta-rs (no JVM); each write is one commit carrying the
transaction `group/topic/partition` -> end offset of each partition it writes and a
survey of its rows.

Its columns and write rules: docs/architecture.md, "The changelog".
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from binlog_assets.config import PipelineConfig
from binlog_assets.consume.lineage import LineageRecord, Mark
from binlog_assets.formats.event import ChangeEvent, Position
from binlog_assets.lakehouse.changelog_rows import (
    ADDED_COLUMNS,
    SURVEY_MAX_BYTES,
    SURVEY_MAX_GROUPS,
    arrow_table,
    changelog_arrow_schema,
    commit_metadata,
    event_row,
    source_origins,
    source_times,
    survey_of_rows,
)
from binlog_assets.lakehouse.delta_log import delta_rs_uri
from binlog_assets.lakehouse.lineage_log import (
    commit_record,
    read_records,
    snapshot_tables,
    stored_tail,
    tail_origin,
    tail_transactions,
)
from binlog_assets.lakehouse.transactions import changelog_app_id
from binlog_assets.lakehouse.txn_log import AppVersions

if TYPE_CHECKING:
    from deltalake import DeltaTable

CHANGELOG_TABLE = "changelog"
TABLE_PROPERTIES = {
    "delta.appendOnly": "true",
    # Replica builds read the commits they have not applied through the change feed's
    # planner (`delta_log.added_rows`); on an append-only table it costs nothing to write
    # (no extra change files).
    "delta.enableChangeDataFeed": "true",
    # Stats on the raw payload and the JSON images would be large and never prune a file.
    "delta.dataSkippingStatsColumns":
        "topic,partition,offset,table,op,pos_phase,pos_file,pos_pos,source_ts,ingested_at",
}

# Creating the table is check-then-act; threads of one process serialize on it.
_CREATE_LOCK = threading.Lock()
# A writer kept open (a follower's, round after round) opens the table anew after this
# many versions: delta-rs's update keeps what every commit since the open added to its
# state (its memory and each update's time grow with them), an open reads from the
# last checkpoint, which delta-rs writes every 100 versions.
REOPEN_VERSIONS = 100


def changelog_name(pipeline: PipelineConfig) -> tuple[str, str]:
    return pipeline.lakehouse.database, CHANGELOG_TABLE


def changelog_uri(pipeline: PipelineConfig) -> str:
    """Where the changelog table lives: the warehouse folder Spark's catalog would give it,
    so a catalog entry (registered by the Spark side) and delta-rs name one table."""
    database, table = changelog_name(pipeline)
    return pipeline.lakehouse.uri("warehouse", f"{database}.db", table)


class ConcurrentPartitionWrite(RuntimeError):
    """Another writer committed the same partition's transaction at the same time."""


class _MetadataChanged(Exception):
    """A commit refused because the table's metadata changed since it was read."""


# A lineage raise changes the table's metadata, which refuses a concurrent append: it is
# written again on the table as it is then (raises are rare; a few tries are plenty).
_METADATA_RETRIES = 5


@dataclass
class ChangelogLineages:
    """A source's `LineageBook` on the changelog (`lineage_log.py`): one per writer and
    source, so the partitions a process runs see each other's raises at once."""

    writer: ChangelogWriter
    source: str
    generation: int = 0
    _seen: list[LineageRecord] | None = None

    def records(self) -> list[LineageRecord]:
        return self.noticed(self.writer.lineages(self.source))

    def raise_lineage(self, record: LineageRecord, expected: int) -> list[LineageRecord]:
        return self.noticed(self.writer.raise_lineage(self.source, record, expected))

    def noticed(self, records: list[LineageRecord]) -> list[LineageRecord]:
        """`records` as just read; a change from the last read moves the generation."""
        if self._seen is not None and records != self._seen:
            self.generation += 1
        self._seen = records
        return records


@dataclass(frozen=True)
class PartitionWrite:
    """One partition's range for `ChangelogWriter.write_many`: its events (offsets below
    `end_offset`), their raw values, and the fence's `check` (see `write`)."""

    events: Sequence[ChangeEvent]
    raw: Mapping[int, bytes] | None
    group_id: str
    topic: str
    partition: int
    end_offset: int
    check: Callable[[int | None], None] | None = None

    @property
    def txn(self) -> str:
        return changelog_app_id(self.group_id, self.topic, self.partition)

    def validate(self) -> None:
        for event in self.events:
            if event.topic != self.topic or event.partition != self.partition:
                raise ValueError(f"event from {event.topic}[{event.partition}] in a write "
                                 f"for {self.topic}[{self.partition}]")
            if event.offset >= self.end_offset:
                raise ValueError(f"event at offset {event.offset} is not below end_offset "
                                 f"{self.end_offset}")


class ChangelogWriter:
    """Appends decoded events to the changelog with delta-rs, one idempotent commit per
    call. Safe to share between threads: commits of one writer take turns."""

    def __init__(self, pipeline: PipelineConfig) -> None:
        self.name = changelog_name(pipeline)
        self.uri = delta_rs_uri(changelog_uri(pipeline))
        self._reset()

    def _reset(self) -> None:
        self._table = None
        self._opened_at = -1
        self._lock = threading.Lock()
        # txn -> the partition's tail as this process last committed it, with its origin
        self._tails: dict[str, Mark] = {}
        self._books: dict[str, ChangelogLineages] = {}
        self._txns = AppVersions(self.uri)  # every partition's transactions, one read

    def _txn_version(self, table: DeltaTable, app_id: str) -> int | None:
        """`table.transaction_version(app_id)`, from one read of the log for all ids."""
        versions = self._txns.of(table)
        return table.transaction_version(app_id) if versions is None else versions.get(app_id)

    def __getstate__(self) -> dict[str, Any]:
        # A worker process gets the table's location alone, and opens the table itself.
        return {"name": self.name, "uri": self.uri}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.name, self.uri = state["name"], state["uri"]
        self._reset()

    def _open(self) -> DeltaTable:
        """The table at its newest version, created when missing. Brought up to date
        while it was opened fewer than REOPEN_VERSIONS versions ago, else opened anew."""
        from deltalake import DeltaTable

        if self._table is not None and self._table.version() - self._opened_at >= \
                REOPEN_VERSIONS:
            self._table = None
        if self._table is None:
            with _CREATE_LOCK:
                if not DeltaTable.is_deltatable(self.uri):
                    database, table = self.name
                    # mode="ignore": another process creating it first is no error.
                    DeltaTable.create(self.uri, changelog_arrow_schema(), mode="ignore",
                                      name=f"{database}.{table}",
                                      configuration=TABLE_PROPERTIES)
                self._table = DeltaTable(self.uri)
                self._add_columns(self._table)
                self._opened_at = self._table.version()
        else:
            self._table.update_incremental()
        return self._table

    def _looked(self) -> DeltaTable:
        """The table as this process last looked at it, opened when it has not yet. A run
        reads its partition's lineage tail and its source's lineages right after its
        checkpoint, which brought the table up to date: another update per partition
        would list the log again (a follower round's hundred partitions, a hundred times).
        Only the partition's own run moves its tail, and a raise by another process is
        noticed after this one's next commit (`_notice_lineages`)."""
        return self._table if self._table is not None else self._open()

    @staticmethod
    def _add_columns(table: DeltaTable) -> None:
        """Columns a changelog made by an earlier release lacks, added once (nullable:
        its older rows hold null)."""
        from deltalake.exceptions import CommitFailedError
        from deltalake.schema import Field

        names = set(table.schema().to_arrow().names)
        missing = [Field(n, {"bigint": "long"}.get(t, t), nullable=True)
                   for n, t in ADDED_COLUMNS if n not in names]
        if missing:
            try:
                table.alter.add_columns(missing)
            except CommitFailedError:
                table.update_incremental()  # another writer added them first

    # -- lineages and tails (`lineage_log.py`) ----------------------------------------
    def lineages(self, source: str) -> list[LineageRecord]:
        """The lineages `source` has raised, as the changelog holds them now."""
        from deltalake import DeltaTable

        with self._lock:
            if self._table is None and not DeltaTable.is_deltatable(self.uri):
                return []
            return read_records(self._looked(), source)

    def raise_lineage(self, source: str, record: LineageRecord, expected: int
                      ) -> list[LineageRecord]:
        """`lineage_log.commit_record` on the changelog, under the writer's lock."""
        doc = {"tag": f"lineage {source} {record.number}#{uuid.uuid4().hex}", "survey": [],
               "lineage": {"source": source, **record.to_json()}}
        with self._lock:
            table = self._open()
            return commit_record(table, source, record, expected, orjson.dumps(doc).decode())

    def book(self, source: str) -> ChangelogLineages:
        """The `LineageBook` of `source`, for the lineage rules of its partitions."""
        with self._lock:
            return self._books.setdefault(source, ChangelogLineages(self, source))

    def _notice_lineages(self, table: DeltaTable) -> None:
        """After a commit: a raise another process made meanwhile moves the generation of
        this process's book of that source, so its partitions read the book again."""
        for source, book in self._books.items():
            if book._seen is not None:
                book.noticed(read_records(table, source))

    def tail(self, group_id: str, topic: str, partition: int) -> Mark | None:
        """Where the partition stands in its source's lineages, as last committed."""
        from deltalake import DeltaTable

        txn = changelog_app_id(group_id, topic, partition)
        with self._lock:
            known = self._tails.get(txn)
            if self._table is None and not DeltaTable.is_deltatable(self.uri):
                return None
            table = self._looked()
            stored = stored_tail(lambda app_id: self._txn_version(table, app_id), txn)
            if known is None and stored is not None:
                # The run's commit compares its tail with this one: read once. A copy: the
                # run's placer moves the one it is given as it places.
                self._tails[txn] = replace(stored)
        if known is not None and stored is not None and \
                (known.lineage, *known.coordinates) == (stored.lineage, *stored.coordinates):
            return Mark(known.lineage, known.file, known.pos, known.server_id, known.gtid_text,
                        known.ts, known.snapshot)
        return stored

    def tail_origin(self, topic: str, partition: int, tail: Mark) -> Mark | None:
        """The tail's server id, GTID and commit time, from its changelog row."""
        return tail_origin(self.uri, topic, partition, tail)

    def snapshot_tables(self, position: Position) -> list[str]:
        """The tables whose schema a snapshot at `position` replayed (its CREATE TABLEs)."""
        return snapshot_tables(self.uri, position)

    def ensure_table(self) -> None:
        """Create the changelog table when missing."""
        with self._lock:
            self._open()

    def checkpoint(self, group_id: str, topic: str, partition: int) -> int | None:
        """The end offset last written for the partition (None: never, or no table)."""
        return self.checkpoints(group_id, [(topic, partition)])[(topic, partition)]

    def checkpoints(self, group_id: str, partitions: Sequence[tuple[str, int]]
                    ) -> dict[tuple[str, int], int | None]:
        """`checkpoint` of each (topic, partition), from one look at the table's log."""
        from deltalake import DeltaTable

        with self._lock:
            if self._table is None and not DeltaTable.is_deltatable(self.uri):
                return dict.fromkeys(partitions)
            table = self._open()
            return {(topic, partition): self._txn_version(
                table, changelog_app_id(group_id, topic, partition))
                for topic, partition in partitions}

    def write(self, part: PartitionWrite) -> int | None:
        """Append `part.events` (offsets below `part.end_offset`) in one commit; its
        version, or None.

        None means a write with a version at or above `end_offset` happened before (a
        retry, or another run): nothing is written. Events below the recorded checkpoint
        are dropped, so a retried range that overlaps a committed one adds only what is
        new. An empty `events` still commits, to move the checkpoint past offsets that
        held no change: the commit carries the transaction and adds no file. `check` is
        given the partition's checkpoint as the write reads it, before anything is
        written, under the writer's lock; it raises to write nothing (the fence's check).
        """
        [outcome] = self.write_many([part])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def write_many(self, parts: Sequence[PartitionWrite]) -> list[int | None | Exception]:
        """`write` of several partitions' ranges in one commit, carrying each one's rows
        and its transaction: per part, in order, the commit's version, None (written
        before, as `write`), or the exception its `check` raised (that part adds
        nothing, the others are committed). A conflicting commit raises
        ConcurrentPartitionWrite for all: nothing is written."""

        for part in parts:
            part.validate()
        for attempt in range(_METADATA_RETRIES):
            try:
                return self._write_many(parts)
            except _MetadataChanged:
                if attempt == _METADATA_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _write_many(self, parts: Sequence[PartitionWrite]) -> list[int | None | Exception]:
        from deltalake import CommitProperties, Transaction, write_deltalake
        from deltalake.exceptions import CommitFailedError

        now = datetime.now(UTC)
        outcomes: list[int | None | Exception] = [None] * len(parts)
        with self._lock:
            table = self._open()
            tails: list = []  # the transactions moving each written part's tail
            moved: dict[str, Mark] = {}
            rows: list[tuple] = []
            written: list[int] = []  # indexes of the parts this commit carries
            for i, part in enumerate(parts):
                done = self._txn_version(table, part.txn)
                if part.check is not None:
                    try:
                        part.check(done)
                    except Exception as exc:  # that part's fence: the others go on
                        outcomes[i] = exc
                        continue
                if done is not None and done >= part.end_offset:
                    continue
                raw = part.raw
                fresh = [e for e in part.events if done is None or e.offset >= done]
                rows += [event_row(e, raw.get(e.offset) if raw else None, now) for e in fresh]
                written.append(i)
                previous = self._tails.get(part.txn) or stored_tail(
                    lambda app_id: self._txn_version(table, app_id), part.txn)
                moves, tail = tail_transactions(part.txn, previous, fresh)
                tails += moves
                if moves:
                    moved[part.txn] = tail
            if not written:
                return outcomes
            tag = ",".join(f"{parts[i].txn}@{parts[i].end_offset}" for i in written)
            n = len(written)
            try:
                write_deltalake(
                    table, arrow_table(rows, now), mode="append",
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(parts[i].txn, parts[i].end_offset)
                                          for i in written] + tails,
                        custom_metadata={"userMetadata": commit_metadata(
                            f"{tag}#{uuid.uuid4().hex}",
                            survey_of_rows(rows, SURVEY_MAX_GROUPS * n), source_times(rows),
                            SURVEY_MAX_BYTES * n, source_origins(rows))}),
                )
            except CommitFailedError as e:
                if "Metadata changed" in str(e):
                    # A lineage raised meanwhile (`lineage_log.py`): read the table again.
                    raise _MetadataChanged from e
                # delta-rs's conflict check refuses a commit whose transaction id another
                # commit took since this one read the table: the race of two runs on one
                # partition, which on object storage no file lock prevents.
                if "Concurrent transaction" not in str(e):
                    raise
                names = ", ".join(f"{parts[i].topic}[{parts[i].partition}]" for i in written)
                raise ConcurrentPartitionWrite(
                    f"{names}: another run committed this partition's changelog at the "
                    f"same time ({e})") from e
            version = table.version()
            self._tails.update(moved)
            self._notice_lineages(table)
            for i in written:
                outcomes[i] = version
            return outcomes


    def append(self, events: Sequence[ChangeEvent], tag: str) -> int:
        """Append `events` that no Kafka partition carried (a re-sync's rows) in one
        commit tagged `tag`; its version. No transaction: a retried append adds the same
        changes again at the same positions, which the position guard applies once."""
        now = datetime.now(UTC)
        version = self.append_rows([event_row(e, None, now) for e in events], tag, now)
        assert version is not None  # no transaction: always written
        return version

    def append_rows(self, rows: Sequence[tuple], tag: str, now: datetime,
                    txn: tuple[str, int] | None = None,
                    loaded: dict[str, int] | None = None) -> int | None:
        """Append `event_row` tuples ingested at `now` in one commit tagged `tag`; its
        version. With `txn` (app id, version), the commit carries that transaction and is
        skipped (None) when the table holds the app id at that version or past it: an
        initial load's worker resumes after its last committed chunk, exactly once.
        `loaded`: rows a direct load's replica holds already, by the load's topic
        (`changelog_rows.commit_metadata`)."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        with self._lock:
            table = self._open()
            if txn is not None:
                done = table.transaction_version(txn[0])
                if done is not None and done >= txn[1]:
                    return None
            write_deltalake(
                table, arrow_table(rows, now), mode="append",
                commit_properties=CommitProperties(
                    custom_metadata={"userMetadata": commit_metadata(
                        f"{tag}#{uuid.uuid4().hex}", survey_of_rows(rows), source_times(rows),
                        loaded=loaded)},
                    app_transactions=None if txn is None else [Transaction(*txn)]),
            )
            return table.version()
