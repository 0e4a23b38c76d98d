"""The bronze changelog: every change event, appended once, with its Kafka coordinates, in
one Delta table written by delta-rs (no JVM); each write is one commit carrying the
transaction `group/topic/partition` -> end offset of each partition it writes and a
survey of its rows.

Its columns and write rules: docs/architecture.md, "The changelog".
"""

from __future__ import annotations

import threading
import uuid
from base64 import b64encode
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import orjson

from binlog_assets.config import PipelineConfig
from binlog_assets.formats.event import ChangeEvent
from binlog_assets.formats.mysql_types import infer_types
from binlog_assets.lakehouse.delta_log import delta_rs_uri
from binlog_assets.lakehouse.transactions import changelog_app_id

if TYPE_CHECKING:
    from arro3.core import Schema, Table
    from deltalake import DeltaTable

CHANGELOG_TABLE = "changelog"

# The changelog's columns and their Delta (Spark SQL) types; `changelog_reader` builds
# the Spark schema from the same list, so the two sides cannot drift apart.
CHANGELOG_COLUMNS: tuple[tuple[str, str], ...] = (
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("row_index", "int"),
    ("table", "string"),
    ("op", "string"),
    ("key", "string"),
    ("key_columns", "array<string>"),
    ("before", "string"),
    ("after", "string"),
    ("pos_phase", "int"),
    ("pos_file", "bigint"),
    ("pos_pos", "bigint"),
    ("pos_row", "int"),
    ("source_ts", "bigint"),
    ("ddl", "string"),
    ("column_types", "string"),
    ("value_types", "string"),
    ("raw", "binary"),
    ("ingested_at", "timestamp"),
)

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


def _json_default(value: Any) -> Any:
    # Exact text for decimals (a JSON number would pass through a double), in plain digits
    # (str() writes 1E-7), and base64 for bytes; the replica casts both back by the
    # column's type.
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, bytes | bytearray | memoryview):
        return b64encode(bytes(value)).decode("ascii")
    return str(value)


def to_json(value: Any) -> str | None:
    """`value` as JSON text for the changelog (None stays None)."""
    if value is None:
        return None
    return orjson.dumps(value, default=_json_default).decode()


# The JSON text of type maps seen before: every row of a table repeats the same few,
# and serializing them was a fifth of the changelog's per-event work. Bounded: a
# producer could vary them without end.
_TYPES_TEXT: dict[tuple, str] = {}
_DECLARED_TEXT: dict[int, tuple[Mapping[str, str], str]] = {}  # id -> (the map, its text)
_MAX_TYPES_TEXT = 1024


def _remembered(memo: dict, key: Any, value: Any) -> Any:
    if len(memo) >= _MAX_TYPES_TEXT:
        memo.clear()
    memo[key] = value
    return value


def _declared_json(column_types: Mapping[str, str]) -> str:
    """`to_json(column_types)`; a decoder shares one map among the events of a schema."""
    seen = _DECLARED_TEXT.get(id(column_types))
    if seen is not None and seen[0] is column_types:
        return seen[1]
    text = to_json(column_types)
    # The map is kept alive with its text, so its id cannot be reused meanwhile.
    return _remembered(_DECLARED_TEXT, id(column_types), (column_types, text))[1]


def _value_types(event: ChangeEvent) -> str | None:
    types = infer_types((event.before, event.after), event.column_types)
    if not types:
        return None
    key = tuple(types.items())
    text = _TYPES_TEXT.get(key)
    return text if text is not None else _remembered(_TYPES_TEXT, key, to_json(types))


def event_row(event: ChangeEvent, raw: bytes | None, ingested_at: datetime) -> tuple:
    """One changelog row, in `changelog_schema()` order."""
    position = event.position
    # DDL events name the key columns but carry no key values.
    key = dict(zip(event.key_columns, event.key, strict=True)) if event.key else None
    declared = event.column_types
    return (
        event.topic, event.partition, event.offset, event.row_index, event.table, event.op,
        to_json(key), list(event.key_columns), to_json(event.before), to_json(event.after),
        position.phase, position.file, position.pos, position.row, event.source_ts,
        event.ddl, _declared_json(declared) if declared else None,
        _value_types(event), raw, ingested_at,
    )


# Each commit's `userMetadata` is a JSON object: its `tag` (see `ChangelogWriter.write`)
# and `survey`, a summary of the commit's rows that lets a replica build learn what a
# range of commits holds from the Delta log instead of scanning it: one entry per
# (table, op, column_types, value_types, key_columns) with its row count and highest
# position. A commit with more distinct entries than this carries none, and a range
# with such a commit (or one written by anything else) is scanned (`read_survey`).
SURVEY_MAX_GROUPS = 256
# Nor does one whose survey would take more than this much of the Delta log (wide tables'
# declared types): every commit's metadata is read again by history and log replays.
# A commit of several partitions' ranges (`write_many`) has both bounds once per
# partition: as much as the commits of each range alone would have.
SURVEY_MAX_BYTES = 64 * 1024
# A range of more commits than this is scanned rather than read from the log.
SURVEY_MAX_COMMITS = 2000
# The Delta operation of the table's creation (delta-rs and Spark alike): it adds no rows.
CREATE_OPERATION = "CREATE TABLE"

# event_row indexes of what the survey keeps.
_ROW_OFFSET, _ROW_INDEX, _ROW_TABLE, _ROW_OP, _ROW_KEY_COLUMNS = 2, 3, 4, 5, 7
_ROW_POSITION = slice(10, 14)
_ROW_COLUMN_TYPES, _ROW_VALUE_TYPES = 16, 17
_ROW_SOURCE_TS = 14


def survey_of_rows(rows: Sequence[tuple], max_groups: int = SURVEY_MAX_GROUPS
                   ) -> list[list] | None:
    """The survey of `event_row` tuples: [table, op, column_types, value_types,
    key_columns, rows, last position (phase, file, pos, row, offset, row_index)] per
    group, or None past `max_groups` groups."""
    groups: dict[tuple, list] = {}
    for r in rows:
        group = (r[_ROW_TABLE], r[_ROW_OP], r[_ROW_COLUMN_TYPES], r[_ROW_VALUE_TYPES],
                 tuple(r[_ROW_KEY_COLUMNS]))
        position = (*r[_ROW_POSITION], r[_ROW_OFFSET], r[_ROW_INDEX])
        entry = groups.get(group)
        if entry is None:
            if len(groups) >= max_groups:
                return None
            groups[group] = [1, position]
        else:
            entry[0] += 1
            if position > entry[1]:
                entry[1] = position
    return [[*g[:4], list(g[4]), n, list(last)] for g, (n, last) in groups.items()]


def source_times(rows: Sequence[tuple]) -> dict[str, int]:
    """Per source table of `event_row` tuples, the latest source commit time (ms)."""
    times: dict[str, int] = {}
    for r in rows:
        ts = r[_ROW_SOURCE_TS]
        if ts is not None and ts > times.get(r[_ROW_TABLE], -1):
            times[r[_ROW_TABLE]] = ts
    return times


def commit_metadata(tag: str, survey: list[list] | None,
                    times: dict[str, int] | None = None,
                    max_bytes: int = SURVEY_MAX_BYTES) -> str:
    """A changelog commit's `userMetadata`: the survey and the tables' latest source
    times (`times`), left out when the survey is None or larger than `max_bytes`."""
    bare = orjson.dumps({"tag": tag}).decode()
    if survey is None:
        return bare
    doc = {"tag": tag, "survey": survey}
    if times:
        doc["times"] = times
    full = orjson.dumps(doc).decode()
    return full if len(full) <= max_bytes else bare


def commit_doc(metadata: str | None) -> dict[str, Any]:
    if not metadata:
        return {}
    try:
        doc = orjson.loads(metadata)
    except orjson.JSONDecodeError:
        return {"tag": metadata}  # a plain tag, as written before surveys
    return doc if type(doc) is dict else {}


def changelog_name(pipeline: PipelineConfig) -> tuple[str, str]:
    return pipeline.lakehouse.database, CHANGELOG_TABLE


def changelog_uri(pipeline: PipelineConfig) -> str:
    """Where the changelog table lives: the warehouse folder Spark's catalog would give it,
    so a catalog entry (registered by the Spark side) and delta-rs name one table."""
    database, table = changelog_name(pipeline)
    return pipeline.lakehouse.uri("warehouse", f"{database}.db", table)


def changelog_arrow_schema() -> Schema:
    from arro3.core import DataType, Field, Schema

    types = {
        "string": DataType.string(), "int": DataType.int32(), "bigint": DataType.int64(),
        "binary": DataType.binary(), "array<string>": DataType.list(DataType.string()),
        "timestamp": DataType.timestamp("us", tz="UTC"),
    }
    return Schema([Field(name, types[t], nullable=True) for name, t in CHANGELOG_COLUMNS])


def _arrow_table(rows: Sequence[tuple], ingested_at: datetime) -> Table:
    """`event_row` tuples as one Arrow table in the changelog's schema."""
    from arro3.core import Array, DataType, Table, list_array

    schema = changelog_arrow_schema()
    n = len(rows)
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(CHANGELOG_COLUMNS)
    arrays = []
    for (_name, kind), field, values in zip(CHANGELOG_COLUMNS, schema, columns, strict=True):
        if kind == "array<string>":
            offsets, flat = [0], []
            for items in values:
                flat.extend(items)
                offsets.append(len(flat))
            arrays.append(list_array(Array(offsets, DataType.int32()),
                                     Array(flat, DataType.string())))
        elif kind == "timestamp":
            # One timestamp for the whole commit (`event_row` is given one `ingested_at`).
            micros = int(ingested_at.timestamp() * 1_000_000)
            arrays.append(Array([micros] * n, DataType.int64()).cast(field.type))
        else:
            arrays.append(Array(list(values), field.type))
    return Table.from_arrays(arrays, schema=schema)


class ConcurrentPartitionWrite(RuntimeError):
    """Another writer committed the same partition's transaction at the same time."""


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
        self._table = None
        self._opened_at = -1
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # A worker process gets the table's location alone, and opens the table itself.
        return {"name": self.name, "uri": self.uri}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.name, self.uri = state["name"], state["uri"]
        self._table = None
        self._opened_at = -1
        self._lock = threading.Lock()

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
                self._opened_at = self._table.version()
        else:
            self._table.update_incremental()
        return self._table

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
            return {(topic, partition): table.transaction_version(
                changelog_app_id(group_id, topic, partition)) for topic, partition in partitions}

    def write(
        self,
        events: Sequence[ChangeEvent],
        raw: Mapping[int, bytes] | None,
        *,
        group_id: str,
        topic: str,
        partition: int,
        end_offset: int,
        check: Callable[[int | None], None] | None = None,
    ) -> int | None:
        """Append `events` (offsets below `end_offset`) in one commit; its version, or None.

        None means a write with a version at or above `end_offset` happened before (a
        retry, or another run): nothing is written. Events below the recorded checkpoint
        are dropped, so a retried range that overlaps a committed one adds only what is
        new. An empty `events` still commits, to move the checkpoint past offsets that
        held no change: the commit carries the transaction and adds no file. `check` is
        given the partition's checkpoint as the write reads it, before anything is
        written, under the writer's lock; it raises to write nothing (the fence's check).
        """
        [outcome] = self.write_many([PartitionWrite(events, raw, group_id, topic, partition,
                                                    end_offset, check)])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def write_many(self, parts: Sequence[PartitionWrite]) -> list[int | None | Exception]:
        """`write` of several partitions' ranges in one commit, carrying each one's rows
        and its transaction: per part, in order, the commit's version, None (written
        before, as `write`), or the exception its `check` raised (that part adds
        nothing, the others are committed). A conflicting commit raises
        ConcurrentPartitionWrite for all: nothing is written."""
        from deltalake import CommitProperties, Transaction, write_deltalake
        from deltalake.exceptions import CommitFailedError

        for part in parts:
            part.validate()
        now = datetime.now(UTC)
        outcomes: list[int | None | Exception] = [None] * len(parts)
        with self._lock:
            table = self._open()
            rows: list[tuple] = []
            written: list[int] = []  # indexes of the parts this commit carries
            for i, part in enumerate(parts):
                done = table.transaction_version(part.txn)
                if part.check is not None:
                    try:
                        part.check(done)
                    except Exception as exc:  # that part's fence: the others go on
                        outcomes[i] = exc
                        continue
                if done is not None and done >= part.end_offset:
                    continue
                raw = part.raw
                rows += [event_row(e, raw.get(e.offset) if raw else None, now)
                         for e in part.events if done is None or e.offset >= done]
                written.append(i)
            if not written:
                return outcomes
            tag = ",".join(f"{parts[i].txn}@{parts[i].end_offset}" for i in written)
            n = len(written)
            try:
                write_deltalake(
                    table, _arrow_table(rows, now), mode="append",
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(parts[i].txn, parts[i].end_offset)
                                          for i in written],
                        custom_metadata={"userMetadata": commit_metadata(
                            f"{tag}#{uuid.uuid4().hex}",
                            survey_of_rows(rows, SURVEY_MAX_GROUPS * n), source_times(rows),
                            SURVEY_MAX_BYTES * n)}),
                )
            except CommitFailedError as e:
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
            for i in written:
                outcomes[i] = version
            return outcomes


    def append(self, events: Sequence[ChangeEvent], tag: str) -> int:
        """Append `events` that no Kafka partition carried (a re-sync's rows) in one
        commit tagged `tag`; its version. No transaction: a retried append adds the same
        changes again at the same positions, which the position guard applies once."""
        from deltalake import CommitProperties, write_deltalake

        now = datetime.now(UTC)
        rows = [event_row(e, None, now) for e in events]
        with self._lock:
            table = self._open()
            write_deltalake(
                table, _arrow_table(rows, now), mode="append",
                commit_properties=CommitProperties(custom_metadata={
                    "userMetadata": commit_metadata(f"{tag}#{uuid.uuid4().hex}",
                                                    survey_of_rows(rows), source_times(rows))}),
            )
            return table.version()


def changelog_checkpoint(pipeline: PipelineConfig, group_id: str, topic: str,
                         partition: int) -> int | None:
    """Where `topic`[`partition`] resumes per the changelog: the end offset last written."""
    return ChangelogWriter(pipeline).checkpoint(group_id, topic, partition)
