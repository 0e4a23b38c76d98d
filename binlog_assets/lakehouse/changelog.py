"""The bronze changelog: every change event, appended once, with its Kafka coordinates.

One Delta table, `<lakehouse.database>.changelog`, holds the events of every source, one
row per event: Kafka coordinates (`topic`, `partition`, `offset`, `row_index`), the
source table (`db.table`), `op`, the key (`key`: a JSON object of the key columns'
values), `before`/`after` as JSON text (their shape varies per table; the replica build
types them), the binlog position as numbers (`pos_phase`, `pos_file`, `pos_pos`,
`pos_row`), `source_ts` (ms), `ddl`, the declared `column_types` (JSON, as the event
carried them), `value_types` (JSON: the types of decoded values for columns the event
declares no type for, since JSON text alone would lose a date or a decimal), the raw
Kafka value and `ingested_at`.

Writes are idempotent: each `ChangelogWriter.write` is one Delta commit carrying the
transaction id `group/topic/partition` with version = the end offset written. Delta
records that version atomically with the rows and skips a later write with a version
not above it, so a retried write adds nothing; `changelog_checkpoint` reads the version
back, and it is the first checkpoint source a consumer run consults. The table is
append-only with Change Data Feed on, which is how replica builds read just the
versions they have not applied. Each commit's metadata also carries a survey of its rows
(tables, ops, types, key columns, counts, last positions), so a replica build plans from
the Delta log and reads the rows once (`read_survey`).
"""

from __future__ import annotations

import threading
import uuid
from base64 import b64encode
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql import types as T

from binlog_assets.config import PipelineConfig
from binlog_assets.formats.event import ChangeEvent
from binlog_assets.lakehouse.delta_log import (
    added_rows,
    table_exists,
    table_version,
    txn_version,
)
from binlog_assets.lakehouse.identifiers import qualified
from binlog_assets.lakehouse.schema import infer_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CHANGELOG_TABLE = "changelog"

_CHANGELOG_COLUMNS = (
    ("topic", T.StringType()),
    ("partition", T.IntegerType()),
    ("offset", T.LongType()),
    ("row_index", T.IntegerType()),
    ("table", T.StringType()),
    ("op", T.StringType()),
    ("key", T.StringType()),
    ("key_columns", T.ArrayType(T.StringType())),
    ("before", T.StringType()),
    ("after", T.StringType()),
    ("pos_phase", T.IntegerType()),
    ("pos_file", T.LongType()),
    ("pos_pos", T.LongType()),
    ("pos_row", T.IntegerType()),
    ("source_ts", T.LongType()),
    ("ddl", T.StringType()),
    ("column_types", T.StringType()),
    ("value_types", T.StringType()),
    ("raw", T.BinaryType()),
    ("ingested_at", T.TimestampType()),
)

_TABLE_PROPERTIES = {
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


def changelog_schema() -> T.StructType:
    return T.StructType([T.StructField(name, t) for name, t in _CHANGELOG_COLUMNS])


def _json_default(value: Any) -> Any:
    # Exact text for decimals (a JSON number would pass through a double) and base64 for
    # bytes; the replica casts both back by the column's type.
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return b64encode(bytes(value)).decode("ascii")
    return str(value)


def to_json(value: Any) -> str | None:
    """`value` as JSON text for the changelog (None stays None)."""
    if value is None:
        return None
    return orjson.dumps(value, default=_json_default).decode()


def _value_types(event: ChangeEvent) -> str | None:
    declared = event.column_types or {}
    types: dict[str, str] = {}
    for image in (event.before, event.after):
        for column, value in (image or {}).items():
            if column not in declared and column not in types:
                inferred = infer_type(value)
                if inferred is not None:
                    types[column] = inferred
    return to_json(types) if types else None


def event_row(event: ChangeEvent, raw: bytes | None, ingested_at: datetime) -> tuple:
    """One changelog row, in `changelog_schema()` order."""
    position = event.position
    # DDL events name the key columns but carry no key values.
    key = dict(zip(event.key_columns, event.key, strict=True)) if event.key else None
    return (
        event.topic, event.partition, event.offset, event.row_index, event.table, event.op,
        to_json(key), list(event.key_columns), to_json(event.before), to_json(event.after),
        position.phase, position.file, position.pos, position.row, event.source_ts,
        event.ddl, to_json(event.column_types) if event.column_types else None,
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
SURVEY_MAX_BYTES = 64 * 1024
# A range of more commits than this is scanned rather than read from the log.
SURVEY_MAX_COMMITS = 2000
# The Delta operation of `ensure_table`'s commit: it adds no rows.
_CREATE_OPERATION = "CREATE TABLE"

# event_row indexes of what the survey keeps.
_ROW_OFFSET, _ROW_INDEX, _ROW_TABLE, _ROW_OP, _ROW_KEY_COLUMNS = 2, 3, 4, 5, 7
_ROW_POSITION = slice(10, 14)
_ROW_COLUMN_TYPES, _ROW_VALUE_TYPES = 16, 17


def survey_of_rows(rows: Sequence[tuple]) -> list[list] | None:
    """The survey of `event_row` tuples: [table, op, column_types, value_types,
    key_columns, rows, last position (phase, file, pos, row, offset, row_index)] per
    group, or None past SURVEY_MAX_GROUPS groups."""
    groups: dict[tuple, list] = {}
    for r in rows:
        group = (r[_ROW_TABLE], r[_ROW_OP], r[_ROW_COLUMN_TYPES], r[_ROW_VALUE_TYPES],
                 tuple(r[_ROW_KEY_COLUMNS]))
        position = (*r[_ROW_POSITION], r[_ROW_OFFSET], r[_ROW_INDEX])
        entry = groups.get(group)
        if entry is None:
            if len(groups) >= SURVEY_MAX_GROUPS:
                return None
            groups[group] = [1, position]
        else:
            entry[0] += 1
            if position > entry[1]:
                entry[1] = position
    return [[*g[:4], list(g[4]), n, list(last)] for g, (n, last) in groups.items()]


def commit_metadata(tag: str, survey: list[list] | None) -> str:
    """A changelog commit's `userMetadata`: the survey left out when it is None or
    larger than SURVEY_MAX_BYTES."""
    bare = orjson.dumps({"tag": tag}).decode()
    if survey is None:
        return bare
    full = orjson.dumps({"tag": tag, "survey": survey}).decode()
    return full if len(full) <= SURVEY_MAX_BYTES else bare


def _commit_doc(metadata: str | None) -> dict[str, Any]:
    if not metadata:
        return {}
    try:
        doc = orjson.loads(metadata)
    except orjson.JSONDecodeError:
        return {"tag": metadata}  # a plain tag, as written before surveys
    return doc if type(doc) is dict else {}


def survey_of_frame(frame: DataFrame) -> list[list]:
    """The survey (as `survey_of_rows`) of changelog rows in a DataFrame: one aggregate
    job over them."""
    from pyspark.sql import functions as F

    from binlog_assets.lakehouse.columns import changelog_position

    groups = (frame.groupBy("table", "op", "column_types", "value_types", "key_columns")
              .agg(F.count(F.lit(1)).alias("n"), F.max(changelog_position()).alias("last"))
              .collect())
    return [[g["table"], g["op"], g["column_types"], g["value_types"],
             list(g["key_columns"] or []), g["n"], list(g["last"])] for g in groups]


def read_survey(spark: SparkSession, config: PipelineConfig, after_version: int | None,
                up_to: int) -> list[list] | None:
    """The surveys of changelog versions (`after_version`, `up_to`] (all versions up to
    `up_to` when `after_version` is None) from their commits' metadata, merged per group
    (as `survey_of_rows`); None when a version carries none (the table's creation counts
    as empty) or the range is longer than SURVEY_MAX_COMMITS."""
    from delta.tables import DeltaTable

    first = 0 if after_version is None else after_version + 1
    if up_to - first >= SURVEY_MAX_COMMITS:
        return None
    database, table = changelog_name(config)
    latest = table_version(spark, database, table)
    history = (DeltaTable.forName(spark, f"{database}.{table}").history(latest - first + 1)
               .select("version", "operation", "userMetadata").collect())
    found = {r.version: (r.operation, _commit_doc(r.userMetadata)) for r in history
             if first <= r.version <= up_to}
    if len(found) != up_to - first + 1:
        return None  # log entries cleaned up
    merged: dict[tuple, list] = {}
    for operation, doc in found.values():
        survey = doc.get("survey", [] if operation == _CREATE_OPERATION else None)
        if survey is None:
            return None
        for *group, n, last in survey:
            key = (*group[:4], tuple(group[4]))
            entry = merged.get(key)
            if entry is None:
                merged[key] = [*group, n, last]
            else:
                entry[5] += n
                entry[6] = max(entry[6], last)
    return list(merged.values())


def changelog_name(config: PipelineConfig) -> tuple[str, str]:
    return config.lakehouse.database, CHANGELOG_TABLE


def app_id(group_id: str, topic: str, partition: int) -> str:
    """The Delta transaction id of one consumer group's writes for one topic-partition."""
    return f"{group_id}/{topic}/{partition}"


class ChangelogWriter:
    """Appends decoded events to the changelog, one idempotent Delta commit per call."""

    def __init__(self, spark: SparkSession, config: PipelineConfig) -> None:
        self.spark = spark
        self.config = config
        self.database, self.table = changelog_name(config)
        self._schema = changelog_schema()
        self._ready = False

    def ensure_table(self) -> None:
        """Create the database and the changelog table when missing."""
        if self._ready:
            return
        with _CREATE_LOCK:
            if not table_exists(self.spark, self.database, self.table):
                from delta.tables import DeltaTable

                self.spark.sql(f"CREATE DATABASE IF NOT EXISTS {qualified(self.database)}")
                builder = DeltaTable.createIfNotExists(self.spark).tableName(
                    f"{self.database}.{self.table}").addColumns(self._schema)
                for key, value in _TABLE_PROPERTIES.items():
                    builder = builder.property(key, value)
                builder.execute()
        self._ready = True

    def write(
        self,
        events: Sequence[ChangeEvent],
        raw: Mapping[int, bytes] | None,
        *,
        group_id: str,
        topic: str,
        partition: int,
        end_offset: int,
    ) -> int | None:
        """Append `events` (offsets below `end_offset`) in one commit; its version, or None.

        None means a write with a version at or above `end_offset` happened before (a
        retry, or another run): nothing is written. Events below the recorded checkpoint
        are dropped, so a retried range that overlaps a committed one adds only what is
        new. An empty `events` still commits, to move the checkpoint past offsets that
        held no change: Delta 4.4 commits an empty append with its transaction and adds
        no file to the table.
        """
        txn = app_id(group_id, topic, partition)
        for event in events:
            if event.topic != topic or event.partition != partition:
                raise ValueError(f"event from {event.topic}[{event.partition}] in a write "
                                 f"for {topic}[{partition}]")
            if event.offset >= end_offset:
                raise ValueError(f"event at offset {event.offset} is not below end_offset "
                                 f"{end_offset}")
        self.ensure_table()
        done = txn_version(self.spark, self.database, self.table, txn)
        if done is not None and done >= end_offset:
            return None
        now = datetime.now(UTC)
        rows = [event_row(e, raw.get(e.offset) if raw else None, now)
                for e in events if done is None or e.offset >= done]
        # The commit's own tag finds its version afterwards: other partitions append to
        # the same table concurrently, so "the latest version" may be someone else's.
        tag = f"{txn}@{end_offset}#{uuid.uuid4().hex}"
        before = table_version(self.spark, self.database, self.table)
        (self.spark.createDataFrame(rows, self._schema).write.format("delta").mode("append")
         .option("txnAppId", txn).option("txnVersion", end_offset)
         .option("userMetadata", commit_metadata(tag, survey_of_rows(rows)))
         .saveAsTable(f"{self.database}.{self.table}"))
        return self._version_tagged(tag, before)

    def _version_tagged(self, tag: str, before: int) -> int | None:
        from delta.tables import DeltaTable

        after = table_version(self.spark, self.database, self.table)
        if after <= before:
            return None
        history = DeltaTable.forName(self.spark, f"{self.database}.{self.table}").history(
            after - before)
        found = [r.version for r in history.select("version", "userMetadata").collect()
                 if _commit_doc(r.userMetadata).get("tag") == tag]
        # Not found: Delta skipped the write because a concurrent one recorded the txn.
        return int(found[0]) if found else None


def changelog_checkpoint(
    spark: SparkSession, config: PipelineConfig, group_id: str, topic: str, partition: int
) -> int | None:
    """Where `topic`[`partition`] resumes per the changelog: the end offset last written."""
    database, table = changelog_name(config)
    return txn_version(spark, database, table, app_id(group_id, topic, partition))


def changelog_version(spark: SparkSession, config: PipelineConfig) -> int:
    """The changelog's current Delta version; -1 before its first write."""
    return table_version(spark, *changelog_name(config))


def read_changelog(
    spark: SparkSession, config: PipelineConfig, after_version: int | None, up_to: int
) -> DataFrame:
    """Changelog rows committed in versions (`after_version`, `up_to`].

    With nothing applied yet (`after_version` None) this is the table as of `up_to`: a
    plain snapshot read, which also works once old log entries are cleaned up. Later
    ranges are the rows those commits added (the table is append-only), read from their
    files only (`delta_log.added_rows`).
    """
    database, table = changelog_name(config)
    if after_version is None:
        name = f"{database}.{table}"
        return spark.read.format("delta").option("versionAsOf", up_to).table(name)
    return added_rows(spark, database, table, after_version + 1, up_to)
