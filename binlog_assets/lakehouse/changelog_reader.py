"""The changelog as Spark reads it: catalog registration, versions, ranges and surveys.

The consumer runs write the changelog with delta-rs and never start a JVM, so they do
not touch the catalog either. The Spark side registers the table (`<database>.changelog`
at `changelog.changelog_uri`) the first time a session reads it, which is what lets
Spark SQL, dbt and users name it; every read here goes through that name.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, NamedTuple

from binlog_assets.config import PipelineConfig
from binlog_assets.identifiers import qualified
from binlog_assets.lakehouse.changelog import (
    changelog_name,
    changelog_uri,
)
from binlog_assets.lakehouse.changelog_rows import (
    CHANGELOG_COLUMNS,
    CREATE_OPERATION,
    SURVEY_MAX_COMMITS,
    commit_doc,
    tag_topic,
)
from binlog_assets.lakehouse.delta_log import (
    added_rows,
    delta_rs_uri,
    ensure_database,
    open_log,
    remember,
    table_exists,
    table_location,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import types as T

_REGISTER_LOCK = threading.Lock()


def changelog_schema() -> T.StructType:
    """The changelog's schema as Spark types (`changelog.CHANGELOG_COLUMNS`)."""
    from pyspark.sql import types as T

    simple = {"string": T.StringType(), "int": T.IntegerType(), "bigint": T.LongType(),
              "binary": T.BinaryType(), "timestamp": T.TimestampType(),
              "array<string>": T.ArrayType(T.StringType())}
    return T.StructType([T.StructField(name, simple[t]) for name, t in CHANGELOG_COLUMNS])


def register_changelog(spark: SparkSession, pipeline: PipelineConfig) -> bool:
    """Name the changelog in the session's catalog once the table exists; False before
    the first consumer run wrote it."""
    from deltalake import DeltaTable

    database, table = changelog_name(pipeline)
    uri = changelog_uri(pipeline)
    with _REGISTER_LOCK:
        if table_exists(spark, database, table):
            table_location(spark, database, table)  # remembered: later calls ask no one
            return True
        if not DeltaTable.is_deltatable(delta_rs_uri(uri)):
            return False
        ensure_database(spark, database)
        location = uri.replace("'", "\\'")
        spark.sql(f"CREATE TABLE IF NOT EXISTS {qualified(database, table)} USING delta "
                  f"LOCATION '{location}'")
        remember(spark, database, table, uri)
        return True


def changelog_version(spark: SparkSession, pipeline: PipelineConfig) -> int:
    """The changelog's current Delta version; -1 before its first write. Read from its
    log by delta-rs at the configured location: no catalog round trip."""
    del spark  # the log alone answers; kept for the callers' symmetry with the readers
    log = _changelog_log(pipeline)
    return -1 if log is None else int(log.version())


def _changelog_log(pipeline: PipelineConfig) -> DeltaTable | None:
    from deltalake.exceptions import TableNotFoundError

    try:
        return open_log(changelog_uri(pipeline))
    except TableNotFoundError:
        return None


def read_changelog(
    spark: SparkSession, pipeline: PipelineConfig, after_version: int | None, up_to: int
) -> DataFrame:
    """Changelog rows committed in versions (`after_version`, `up_to`].

    With nothing applied yet (`after_version` None) this is the table as of `up_to`: a
    plain snapshot read, which also works once old log entries are cleaned up. Later
    ranges are the rows those commits added (the table is append-only), read from their
    files only (`delta_log.added_rows`).
    """
    register_changelog(spark, pipeline)
    database, table = changelog_name(pipeline)
    if after_version is None:
        name = f"{database}.{table}"
        return spark.read.format("delta").option("versionAsOf", up_to).table(name)
    return added_rows(spark, database, table, after_version + 1, up_to)


class SurveyGroup(NamedTuple):
    """One group of a changelog survey: rows of one table, op, types and key columns,
    how many, and the highest position among them."""

    table: str
    op: str
    column_types: str | None  # JSON: column -> declared type
    value_types: str | None  # JSON: column -> type inferred from the values
    key_columns: list[str]
    rows: int
    last: list[int]  # (lineage, file, pos, row, offset, row_index)
    # The table's latest source commit time (ms) in the range; None where unrecorded.
    source_ts: int | None = None
    # Where the table's furthest change in the range was written: [position, server id,
    # GTID] (`changelog_rows.source_origins`); None where unrecorded.
    origin: list | None = None


def survey_of_frame(frame: DataFrame) -> list[SurveyGroup]:
    """The survey (as `changelog.survey_of_rows`) of changelog rows in a DataFrame: one
    aggregate job over them."""
    from pyspark.sql import functions as F

    from binlog_assets.lakehouse.columns import changelog_position

    groups = (frame.groupBy("table", "op", "column_types", "value_types", "key_columns")
              .agg(F.count(F.lit(1)).alias("n"), F.max(changelog_position()).alias("last"),
                   F.max("source_ts").alias("ts"))
              .collect())
    times: dict[str, int] = {}  # per table, as commits record them (`source_times`)
    for g in groups:
        if g["ts"] is not None:
            times[g["table"]] = max(g["ts"], times.get(g["table"], g["ts"]))
    return [SurveyGroup(g["table"], g["op"], g["column_types"], g["value_types"],
                        list(g["key_columns"] or []), g["n"], list(g["last"]),
                        times.get(g["table"])) for g in groups]


def read_survey(spark: SparkSession | None, pipeline: PipelineConfig, after_version: int | None,
                up_to: int) -> list[SurveyGroup] | None:
    """The surveys of changelog versions (`after_version`, `up_to`] (all versions up to
    `up_to` when `after_version` is None) from their commits' metadata, merged per group
    (as `survey_of_rows`); None when a version carries none (the table's creation counts
    as empty) or the range is longer than SURVEY_MAX_COMMITS."""
    first = 0 if after_version is None else after_version + 1
    if up_to - first >= SURVEY_MAX_COMMITS:
        return None
    # The commits' metadata from the log itself (delta-rs), not a Spark job.
    log = _changelog_log(pipeline)
    if log is None:
        return None
    uri, table_id = log.table_uri, log.metadata().id
    # Every replica of a cycle asks for the same range: merged once.
    with _commits_lock:
        last = _merged.get(uri)
    if last is not None and last[:3] == (table_id, first, up_to):
        return last[3]
    groups = _merged_surveys(log, first, up_to)
    with _commits_lock:
        _merged[uri] = (table_id, first, up_to, groups)
    return groups


def loaded_rows(pipeline: PipelineConfig, after_version: int | None, up_to: int,
                topics: list[str]) -> int:
    """Of the rows `read_survey` counts in the same versions, those the loads `topics`
    wrote straight into their replica as well (their commits' `loaded`)."""
    log = _changelog_log(pipeline)
    first = 0 if after_version is None else after_version + 1
    found = None if log is None or not topics else _commit_docs(log, first, up_to)
    return sum(doc.get("loaded", {}).get(topic, 0) for _, doc in found or ()
               for topic in topics)


def _merged_surveys(log: DeltaTable, first: int, up_to: int) -> list[SurveyGroup] | None:
    found = _commit_docs(log, first, up_to)
    if found is None:
        return None  # log entries cleaned up
    merged: dict[tuple, tuple[int, list[int]]] = {}  # group -> (rows, last position)
    times: dict[str, int] = {}  # table -> latest source time, of commits that record it
    origins: dict[str, list] = {}  # table -> origin of its furthest change
    for operation, doc in found:
        survey = doc.get("survey", [] if operation == CREATE_OPERATION else None)
        if survey is None:
            return None
        # A commit stores its survey as JSON arrays (`changelog.survey_of_rows`).
        for *group, n, last in survey:
            key = (*group[:4], tuple(group[4]))
            seen = merged.get(key)
            merged[key] = (n, last) if seen is None else (seen[0] + n, max(seen[1], last))
        for table, ts in doc.get("times", {}).items():
            times[table] = max(ts, times.get(table, ts))
        for table, origin in doc.get("origins", {}).items():
            if table not in origins or origin[0] > origins[table][0]:
                origins[table] = origin
    return [SurveyGroup(*key[:4], list(key[4]), n, last, times.get(key[0]),
                        origins.get(key[0]))
            for key, (n, last) in merged.items()]


# changelog location -> (table id, version -> (operation, metadata document)): a commit's
# metadata never changes, and every replica of a follower cycle surveys the same versions;
# reading them again per replica cost a log read per version (O(tables) per replica).
_commits: dict[str, tuple[str, dict[int, tuple[str | None, dict]]]] = {}
# changelog location -> (table id, first, last version, their merged surveys)
_merged: dict[str, tuple[str, int, int, list[SurveyGroup] | None]] = {}
_commits_lock = threading.Lock()


def _commit_docs(log: DeltaTable, first: int, up_to: int
                 ) -> list[tuple[str | None, dict]] | None:
    """(operation, metadata document) of changelog versions `first`..`up_to`, each read
    from the log once per process and table; None when the log no longer has them all."""
    uri, table_id = log.table_uri, log.metadata().id
    with _commits_lock:
        known = _commits.get(uri)
        docs = dict(known[1]) if known is not None and known[0] == table_id else {}
    missing = [v for v in range(first, up_to + 1) if v not in docs]
    if missing:
        newest = log.version()
        for h in log.history(newest - missing[0] + 1):
            version = h.get("version", -1)
            if version >= missing[0] and version not in docs:
                docs[version] = (h.get("operation"), commit_doc(h.get("userMetadata")))
        # The newest versions are the ones the next cycles survey again.
        kept = {v: d for v, d in docs.items() if v > newest - SURVEY_MAX_COMMITS}
        with _commits_lock:
            _commits[uri] = (table_id, kept)
    found = [docs[v] for v in range(first, up_to + 1) if v in docs]
    return found if len(found) == up_to - first + 1 else None


class SourceClock:
    """The newest source commit time the changelog holds of each source, brought forward
    version by version from its commits' metadata (`times`, per table of the commit's
    source): with Debezium's heartbeat action writing a heartbeat table the source
    captures, it moves while the tables a replica reads are idle, and says how current an
    idle replica is (README: Failover, binlog resets and snapshots)."""

    def __init__(self, pipeline: PipelineConfig) -> None:
        self.pipeline = pipeline
        self.version: int | None = None
        self.times: dict[str, int] = {}  # source name -> newest source commit time (ms)

    def advance(self, up_to: int) -> dict[str, int]:
        """The times as of changelog version `up_to`; versions whose metadata is gone
        from the log (or a first call far behind it) read only the recent ones."""
        log = _changelog_log(self.pipeline)
        if log is None or up_to < 0:
            return self.times
        first = max(0, up_to - SURVEY_MAX_COMMITS + 1 if self.version is None
                    else self.version + 1)
        if first > up_to:
            return self.times
        for _op, doc in _commit_docs(log, first, up_to) or ():
            topic = tag_topic(doc.get("tag") or "")
            times = doc.get("times") or {}
            if topic is None or not times:
                continue
            try:
                source = self.pipeline.source_for_topic(topic).name
            except KeyError:
                continue
            newest = max(times.values())
            if newest > self.times.get(source, -1):
                self.times[source] = newest
        self.version = up_to
        return self.times


class LazyRange:
    """Changelog versions (`after_version`, `up_to`] as a DataFrame, planned on first use:
    an apply reduced as Arrow never needs it. `single`: in one partition."""

    def __init__(self, read: Callable[[], DataFrame]) -> None:
        self._read = read
        self._frame: DataFrame | None = None
        self.single = False

    def frame(self) -> DataFrame:
        if self._frame is None:
            self._frame = self._read()
        return self._frame.coalesce(1) if self.single else self._frame
