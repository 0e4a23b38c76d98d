"""Planning one apply: what the batch holds for the replica (`survey_batch`, from the
surveys its changelog commits carry) and how the replica is keyed (`key_rule`).

A replica is keyed by its table config's `key_columns`, else by the primary key its
changes carry; one configured `replica_mode: append`, or one whose changes carry no key
and that sets neither, is the append-only log of its changes, with a warning naming the
settings. A replica keeps the rule it was built with (a table property); changing it
takes a rebuild, and the error says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

from pyspark.sql import types as T

from binlog_assets.formats.event import (
    OP_CREATE,
    OP_DDL,
    OP_DELETE,
    OP_READ,
    OP_TRUNCATE,
    OP_UPDATE,
)
from binlog_assets.identifiers import check_columns
from binlog_assets.lakehouse.changelog_reader import (
    SurveyGroup,
    loaded_rows,
    read_survey,
    survey_of_frame,
)
from binlog_assets.lakehouse.replica.routes import SOURCE_KEY_COLUMNS, ReplicaRoute
from binlog_assets.lakehouse.schema import spark_type, widen_all

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession

    from binlog_assets.config import PipelineConfig
    from binlog_assets.lakehouse.delta_log import NewTable

ROW_OPS = (OP_CREATE, OP_UPDATE, OP_READ, OP_DELETE)
LIVE_OPS = (OP_CREATE, OP_UPDATE, OP_READ)
MERGED_OPS = (*ROW_OPS, OP_TRUNCATE)

# Table properties recording what a replica was built with; a batch that disagrees fails.
KEY_PROPERTY = "binlake.key_columns"
RULE_PROPERTY = "binlake.key_rule"
SHARDED_PROPERTY = "binlake.sharded"
TRUNCATED_PROPERTY = "binlake.truncated"


def marker_column(props: dict[str, str]) -> str | None:
    """A source key column of the replica with table properties `props`: null in its
    truncate markers only (a change without its key fails the apply)."""
    key = json.loads(props.get(KEY_PROPERTY, "[]")) or [None]
    return key[0]

# Each opt-in table feature (`lakehouse.table_features`) and the property that turns it
# on. None is on by default: each adds a reader feature that delta-rs (and the readers
# built on it) refuse, so a replica would be Spark's alone (README: Table features).
FEATURE_PROPERTIES = {
    # A MERGE that touches a few rows of a file marks them instead of rewriting the file.
    "deletion_vectors": ("delta.enableDeletionVectors", "true"),
    # Column names with characters Delta otherwise refuses (` ,;{}()\n\t=`), stored as
    # written; renames and drops without rewriting files.
    "column_mapping": ("delta.columnMapping.mode", "name"),
    # Widening int -> bigint, float -> double or a decimal's precision without a rewrite
    # (without it, a widened column rewrites the table once: `schema.apply_changes`).
    "type_widening": ("delta.enableTypeWidening", "true"),
}


def feature_properties(features: list[str]) -> dict[str, str]:
    return dict(FEATURE_PROPERTIES[f] for f in features)


# How a replica's rows are keyed, as its asset's metadata reports it.
PRIMARY_KEY = "primary_key"  # by the primary key the changes carry
KEY_COLUMNS = "key_columns"  # by the table config's key_columns
APPEND_ONLY = "append_only"  # no key: a row per change (replica_mode: append, or keyless)


@dataclass(frozen=True)
class ReplicaResult:
    """What one apply did; numbers stay numbers so the UI can chart them."""

    replica: str
    rows: int = 0  # changelog rows of the replica's source tables read by this apply
    applied_version: int = -1  # changelog version the replica now reflects
    # Highest (phase, file, pos, row, offset, row_index) in the batch, None if empty.
    last_position: tuple[int, ...] | None = None
    upserts: int = 0  # insert, update and snapshot events read
    deletes: int = 0  # delete events read
    written: int = 0  # replica rows inserted or updated (after the reduce and the guard)
    truncated: int = 0  # rows removed by truncates
    tombstones: int = 0  # tombstones purged, past lakehouse.tombstone_retention_hours
    schema_changes: tuple[str, ...] = field(default_factory=tuple)
    skipped: bool = False  # nothing new: the replica was already at applied_version
    key_rule: str | None = None  # PRIMARY_KEY, KEY_COLUMNS, APPEND_ONLY; None: no table yet
    warning: str | None = None  # what to set for the replica the config may have meant
    # The latest source commit time (ms) of the changes applied, where recorded.
    last_source_ts: int | None = None
    # The server id and GTID the furthest change applied was written with, where said.
    last_server_id: int | None = None
    last_gtid: str | None = None
    held: bool = False  # a load appends to the replica: nothing applied until it ends


def applied_result(route: ReplicaRoute, survey: Survey, up_to: int, rule: KeyRule,
                   changes: list[str], **counts: int) -> ReplicaResult:
    """The result of an apply that wrote the batch: what it read and `counts` of what it
    wrote."""
    return ReplicaResult(
        route.replica,
        rows=survey.rows,
        applied_version=up_to,
        last_position=survey.last_position,
        upserts=survey.upserts,
        deletes=survey.deletes,
        schema_changes=tuple(changes),
        key_rule=rule.name,
        warning=rule.warning,
        last_source_ts=survey.last_source_ts,
        last_server_id=survey.last_origin[1] if survey.last_origin else None,
        last_gtid=survey.last_origin[2] if survey.last_origin else None,
        **counts,
    )


class ReplicaError(RuntimeError):
    """A replica that cannot be built from its changelog as configured; says why."""


@dataclass(frozen=True)
class KeyRule:
    """The replica's key rule for one apply: its name, its key (source ids first when
    sharded; empty when append-only) and a warning for the asset's metadata."""

    name: str
    key: list[str]
    warning: str | None = None

    @property
    def append(self) -> bool:
        return self.name == APPEND_ONLY


@dataclass
class Survey:
    """One aggregate pass over the batch: what it holds for this replica."""

    tables: list[str]
    rows: int
    last_position: tuple[int, ...] | None
    declared: dict[str, T.DataType]
    inferred: dict[str, T.DataType]
    key_columns: set[tuple[str, ...]]
    truncates: dict[str, tuple[int, ...]]  # db.table -> highest truncate position
    upserts: int = 0
    deletes: int = 0
    # db.table -> (position, lower-case columns) of its latest declared definition
    table_columns: dict[str, tuple[tuple[int, ...], list[str]]] = field(default_factory=dict)
    # Whether the batch holds any DDL (a rename or drop may concern the replica).
    ddl: bool = False
    # Replica column (lower-case) -> former names a renamed column has in older images.
    aliases: dict[str, list[str]] = field(default_factory=dict)
    # Column (lower-case) -> (db.table, position, SQL literal or None) of each ADD of it
    # in the batch: that table's rows older than the ADD hold the default.
    added: dict[str, list[tuple[str, tuple[int, ...], str | None]]] = field(
        default_factory=dict)
    # Tables in the batch that the replica does not take.
    others: set[str] = field(default_factory=set)
    # The latest source commit time (ms) of the batch's row changes, where recorded.
    last_source_ts: int | None = None
    # [position, server id, GTID] of the furthest change of the batch's tables, where
    # the producer said (`changelog_rows.source_origins`).
    last_origin: list | None = None


@dataclass(frozen=True)
class ReplicaTable:
    """The replica's table as an apply finds it: its name, whether it exists, its table
    properties, number of data files and location; `new`, when it does not exist yet,
    is the table to create with the batch's rows."""

    name: tuple[str, str]
    exists: bool
    props: dict[str, str] = field(default_factory=dict)
    files: int = 0
    location: str = ""
    new: NewTable | None = None

    @property
    def empty(self) -> bool:
        return self.files == 0


@dataclass(frozen=True)
class Found:
    """What an apply finds before it reads the batch: the replica's route and table, the
    key rule it was built with (None before its first apply), and the changelog version
    each table it writes (the replica, its history) reflects (None before its first
    apply)."""

    route: ReplicaRoute
    table: ReplicaTable
    stored_rule: str | None
    applied: dict[tuple[str, str], int | None]


@dataclass(frozen=True)
class Versions:
    """The changelog versions an apply reads, after `start` (None: from the first) up to
    `up_to`, and the tables (the replica, its history) not at `up_to` yet."""

    start: int | None
    up_to: int
    behind: list[tuple[str, str]]


class Stamp(NamedTuple):
    """What an apply marks its writes with: the changelog version it applies up to (each
    commit's transaction version) and its time (each row's `_applied_at`)."""

    version: int
    at: datetime


@dataclass(frozen=True)
class RowShape:
    """How an apply shapes the replica's rows: its route, what the batch holds (the
    spellings, truncates and ADDs of `Survey`), the key, and the replica's key and
    source columns with their types."""

    route: ReplicaRoute
    survey: Survey
    key: list[str]
    columns: dict[str, T.DataType]


def survey_batch(spark: SparkSession, pipeline: PipelineConfig, batch: Callable[[], DataFrame],
                 route: ReplicaRoute, start: int | None, up_to: int,
                 loads: list[str] = ()) -> Survey:
    """Tables, types, keys and truncates of the batch: from the surveys its commits
    carry in the Delta log (`changelog.read_survey`), else in one aggregate job over
    `batch()`. `loads`: the topics of the loads the replica holds (`batch()` is without
    their rows, and so is the survey)."""
    groups = read_survey(spark, pipeline, start, up_to)
    held = 0
    if groups is None:
        groups = survey_of_frame(batch())
    elif loads:
        held = loaded_rows(pipeline, start, up_to, list(loads))
    tables = route.select({g.table for g in groups})
    survey = Survey(tables, 0, None, {}, {}, set(), {})
    add_groups(survey, groups)
    # A load's rows are snapshot reads of one table: upserts, all of them.
    survey.rows -= held
    survey.upserts -= held
    return survey


def add_groups(survey: Survey, groups: list[SurveyGroup]) -> None:
    """Count `groups` of the tables in `survey.tables` into the survey; of other tables
    it keeps their names and whether the batch holds DDL."""
    routed = set(survey.tables)
    # Earliest first, so that the column order of a new table is the source's.
    for table, op, column_types, value_types, key_columns, n, last, ts, origin in sorted(
            groups, key=lambda g: g.last):
        survey.ddl = survey.ddl or op == OP_DDL
        if table not in routed:
            survey.others.add(table)
            continue
        last = tuple(last)
        if column_types and op != OP_TRUNCATE:
            # Sorted by position: the last group seen is the table's latest definition
            # (with the image fields it did not declare).
            survey.table_columns[table] = (last, [
                c.lower() for types in (column_types, value_types) if types
                for c in json.loads(types)])
        if op in LIVE_OPS:
            survey.upserts += n
        elif op == OP_DELETE:
            survey.deletes += n
        if op in ROW_OPS and ts is not None:
            survey.last_source_ts = max(ts, survey.last_source_ts or ts)
        if op in MERGED_OPS:
            survey.rows += n
            if survey.last_position is None or last > survey.last_position:
                survey.last_position = last
        if origin is not None and (survey.last_origin is None
                                   or origin[0] > survey.last_origin[0]):
            survey.last_origin = origin
        if op == OP_TRUNCATE:
            current = survey.truncates.get(table)
            survey.truncates[table] = last if current is None else max(current, last)
        if op in ROW_OPS and key_columns:
            survey.key_columns.add(tuple(key_columns))
        for types, target in ((column_types, survey.declared),
                              (value_types, survey.inferred)):
            if types:
                widen_all(target, {c: spark_type(t) for c, t in json.loads(types).items()})


def key_rule(route: ReplicaRoute, survey: Survey, props: dict[str, str]) -> KeyRule | None:
    """The replica's key rule: `replica_mode: append`, else `key_columns`, else the
    primary key the changes carry, else (a table without one) append-only with a
    warning saying what to set; None while neither the batch nor the table knows.

    A replica keeps the rule it was built with. A config that asks for another fails
    with the way out (a rebuild); a source that gains or loses its primary key does
    not fail the build.
    """
    stored = json.loads(props.get(KEY_PROPERTY, "null"))
    stored_rule = recorded_rule(route, props)
    if route.replica_mode == "append":
        if stored_rule not in (None, APPEND_ONLY):
            raise ReplicaError(
                f"replica {route.replica!r} is keyed on {stored}, and its config now says "
                "replica_mode: append: rebuild it (build_replicas_job with "
                "ops.replicas.config.rebuild: true) to make it the log of changes")
        return KeyRule(APPEND_ONLY, [])
    if route.key_columns:
        name, source_key = KEY_COLUMNS, tuple(route.key_columns)
    elif len(survey.key_columns) == 1:
        name, (source_key,) = PRIMARY_KEY, survey.key_columns
    elif len(survey.key_columns) > 1:
        raise ReplicaError(
            f"replica {route.replica!r}: its source tables disagree on the primary key "
            f"({sorted(survey.key_columns)}); set key_columns in the table config")
    elif stored_rule == APPEND_ONLY:
        return KeyRule(APPEND_ONLY, [], fallback_warning(route, APPEND_ONLY))
    elif stored_rule is not None:
        name, source_key = stored_rule, tuple(stored)  # no key in this batch
    elif survey.upserts or survey.deletes:
        return KeyRule(APPEND_ONLY, [], fallback_warning(route, APPEND_ONLY))
    else:
        return None  # truncates only, of a table not built yet
    if stored_rule == APPEND_ONLY:
        if name == KEY_COLUMNS:
            raise ReplicaError(
                f"replica {route.replica!r} was built append-only (its changes carried "
                f"no key), and its config now sets key_columns {list(source_key)}: "
                "rebuild it (build_replicas_job with ops.replicas.config.rebuild: true) "
                "to key it by them")
        # The source gained a primary key: the log goes on; a rebuild would key it.
        return KeyRule(APPEND_ONLY, [], (
            f"{fallback_warning(route, APPEND_ONLY)}. Its changes now carry the primary "
            f"key {list(source_key)}: rebuild the replica to key it by that"))
    check_columns(source_key, route.replica)
    if stored is not None and tuple(stored) != source_key:
        raise ReplicaError(
            f"replica {route.replica!r} is keyed on {stored}, its changes now on "
            f"{list(source_key)}: rebuild it (ReplicaBuilder.rebuild) after the "
            "source's primary key change")
    key = [*SOURCE_KEY_COLUMNS, *source_key] if route.sharded else list(source_key)
    return KeyRule(name, key)


def recorded_rule(route: ReplicaRoute, props: dict[str, str]) -> str | None:
    """The key rule the replica was built with (from its table properties); None when
    there is no table yet. Replicas built before the rule was recorded are keyed."""
    if not props:
        return None
    return props.get(RULE_PROPERTY) or (KEY_COLUMNS if route.key_columns else PRIMARY_KEY)


def fallback_warning(route: ReplicaRoute, rule: str | None) -> str | None:
    """What to set when a replica is append-only only because its changes carry no key."""
    if rule != APPEND_ONLY or route.replica_mode == "append":
        return None
    return (f"replica {route.replica!r}: the changes of its source table(s) carry no primary "
            "key, so the replica is the append-only log of their changes (a row per change). "
            "For a row per source row set key_columns: [<unique, never-null columns>] in the "
            "table config and rebuild the replica; to keep the log and silence this, set "
            "replica_mode: append")


def replicas_touched(pipeline: PipelineConfig, routes: dict[str, ReplicaRoute],
                     after_version: int, up_to: int) -> set[str] | None:
    """The replicas (of `routes`) whose source tables changelog versions (`after_version`,
    `up_to`] hold rows of, from the surveys their commits carry; None when every replica
    must look: the surveys are missing or too many to read, or the versions hold DDL (a
    rename may bring a table to any replica)."""
    groups = read_survey(None, pipeline, after_version, up_to)
    if groups is None or any(g.op == OP_DDL for g in groups):
        return None
    tables = {g.table for g in groups}
    return {name for name, route in routes.items() if route.select(tables)}
