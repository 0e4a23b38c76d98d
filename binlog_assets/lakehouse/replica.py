"""Silver replicas: each replica table equals its source tables as of the last applied position.

`ReplicaBuilder.apply` reads the changelog rows committed since the replica's applied
changelog version (planned from the surveys their commits carry, see `changelog.py`),
keeps the source tables routed to the replica (`routing.py`), reduces every key to its
last change by binlog position, types its `before`/`after` JSON by the declared column
types (`schema.py`), and MERGEs the result with a position guard.
Batch boundaries, duplicates, restarts and late events therefore cannot change the
outcome (DESIGN.md invariants 3 and 5):

- Position. `_position` is one struct column, `(phase, file, pos, row, offset,
  row_index)`: the binlog position as numbers (snapshot phase below streaming), then the
  Kafka offset and the row within a record as tie-breakers. Spark compares structs field
  by field, so `s._position > t._position` is the whole guard; no string ever compares.
- Reduce, then guard. Each key keeps only its highest-position change of the batch
  (one bucket for inserts, updates and deletes alike, so they can never be reordered),
  and a row is written only when that change is newer than the row's stored position.
  The reduce runs on the typed key with the images still JSON text: only the changes
  that win it are parsed and typed.
  Re-applying an applied range changes nothing; an older change arriving late is dropped.
  Into an empty table (an initial build, a rebuild) the reduced batch is simply appended.
  A batch with at least `lakehouse.rewrite_ratio` changes per stored row (a catch-up,
  which touches every file anyway) skips MERGE: the stored rows and the batch go through
  one ranking per key (highest position wins, the stored row on a tie) and the result
  overwrites the table in one commit (`_rewrite_replica`).
- Tombstones. A delete keeps the row with `_op = 'd'` (values as the delete's
  before-image) so a late, older change for that key finds a newer position and is
  dropped. Tombstones older than `lakehouse.tombstone_retention_hours` (by `_applied_at`)
  are purged by an apply that reads changes, at most once per tenth of the window; a
  change arriving more than that window after the delete of its key could bring the row
  back, which is the window's contract.
- Truncate. An `op = 't'` event removes the table's rows below its position and leaves
  a marker row (`_op = 't'`, key columns null) whose position is the table's watermark:
  any later-arriving change below it is dropped. Markers are kept for good (one per
  source table).
- Primary-key change. Decoders split it into delete (old key) + create (new key); when
  the replica's key is a `key_columns` override the decoder may not know about, an
  update whose before-image holds another key also deletes the old key here.
- Key rule. A replica is keyed by its table config's `key_columns`, else by the primary
  key its changes carry; one configured `replica_mode: append`, or one whose changes
  carry no key and that sets neither, is instead the append-only log of its changes
  (`append_replica.py`), with a warning naming the settings. The rule is recorded on the
  table and reported in every result (`key_rule`); changing it takes a rebuild.
- Applied version. Each MERGE commits with Delta's idempotent-DML transaction id
  (`binlake.replica`, version = the changelog version applied), atomically with the data;
  the replica's applied version is that transaction's version, and a retried commit of
  the same version is skipped by Delta itself. A range with nothing for the replica
  still commits (an empty MERGE) to move the applied version.

Replica table `<database>.<replica>`: `_source_db`, `_source_table` (in the key when the
replica gathers several source tables), the key columns, the source columns, then
`_position`, `_op` (c/u/r live, d tombstone, t truncate marker), `_source_ts` (source
commit time) and `_applied_at` (when this apply wrote the row). Live rows are the view
`<database>.<replica>_current` (`_op` not in d, t): what dbt reads. Tables use Delta
column mapping (any source column name), type widening and deletion vectors.
With `history: true`, `<database>.<replica>_history` keeps SCD type 2 versions
(`history.py`).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql import types as T

from binlog_assets.config import PipelineConfig
from binlog_assets.faults import fault_point
from binlog_assets.formats.event import OP_CREATE, OP_DELETE, OP_READ, OP_TRUNCATE, OP_UPDATE
from binlog_assets.lakehouse.changelog import SURVEY_MAX_COMMITS, to_json
from binlog_assets.lakehouse.changelog_reader import (
    changelog_version,
    read_changelog,
    read_survey,
    survey_of_frame,
)
from binlog_assets.lakehouse.columns import (
    POSITION_TYPE,
    changelog_position,
    first_per_group,
    free_name,
    is_source_table,
    key_match,
    position_literal,
    split_table,
    working_column,
)
from binlog_assets.lakehouse.delta_log import (
    create_table,
    forget,
    merge_aliases,
    metrics_since,
    stored_rows,
    table_detail,
    table_exists,
    table_version,
    txn_version,
)
from binlog_assets.lakehouse.identifiers import check_columns, col, qualified
from binlog_assets.lakehouse.routing import SOURCE_KEY_COLUMNS, ReplicaRoute, replica_route
from binlog_assets.lakehouse.schema import (
    SchemaChange,
    apply_changes,
    plan_changes,
    spark_type,
    widen_all,
)
from binlog_assets.lakehouse.spark import new_session

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

# The Delta transaction id under which replica (and history) MERGEs record the applied
# changelog version.
APP_ID = "binlake.replica"

ROW_OPS = (OP_CREATE, OP_UPDATE, OP_READ, OP_DELETE)
LIVE_OPS = (OP_CREATE, OP_UPDATE, OP_READ)
MERGED_OPS = (*ROW_OPS, OP_TRUNCATE)

REPLICA_METADATA = (
    ("_position", POSITION_TYPE),
    ("_op", T.StringType()),
    ("_source_ts", T.TimestampType()),
    ("_applied_at", T.TimestampType()),
)
METADATA_COLUMNS = frozenset({*SOURCE_KEY_COLUMNS, *(n for n, _ in REPLICA_METADATA),
                              "_valid_from", "_valid_to", "_is_current"})

# Working columns of an apply, named so that no source column can clash with them: a
# change's image as JSON text, and a truncate's watermark (source table and position).
_IMAGE = working_column("image")
_WM_DB, _WM_TABLE, _WM = (working_column(n) for n in ("wm_db", "wm_table", "wm"))

# Table properties recording what a replica was built with; a batch that disagrees fails.
KEY_PROPERTY = "binlake.key_columns"
RULE_PROPERTY = "binlake.key_rule"
SHARDED_PROPERTY = "binlake.sharded"
TRUNCATED_PROPERTY = "binlake.truncated"
PURGED_PROPERTY = "binlake.tombstones_purged_at"  # epoch seconds of the last purge
# A purge (a DELETE scanning the table's `_applied_at` statistics) runs at most once per
# this share of the retention window, so tombstones live between 1 and 1.1 windows.
PURGE_EVERY = 0.1

_TABLE_PROPERTIES = {
    # Source column names may hold anything a MySQL identifier can; column mapping stores
    # them as written (and allows adding columns without rewriting files).
    "delta.columnMapping.mode": "name",
    # Widening int -> bigint, float -> double or a decimal's precision without a rewrite.
    "delta.enableTypeWidening": "true",
    # A MERGE that touches a few rows of a file marks them instead of rewriting the file.
    "delta.enableDeletionVectors": "true",
}

# Session settings are per SparkSession; the builder's own session holds them, and the
# lock keeps two threads of one builder from interleaving their transaction ids.
_TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"


# How a replica's rows are keyed, as its asset's metadata reports it.
PRIMARY_KEY = "primary_key"  # by the primary key the changes carry
KEY_COLUMNS = "key_columns"  # by the table config's key_columns
APPEND_ONLY = "append_only"  # no key: a row per change (replica_mode: append, or keyless)


class ReplicaError(RuntimeError):
    """A replica that cannot be built from its changelog as configured; says why."""


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


@dataclass(frozen=True)
class _Rule:
    """The replica's key rule for one apply: its name, its key (source ids first when
    sharded; empty when append-only) and a warning for the asset's metadata."""

    name: str
    key: list[str]
    warning: str | None = None

    @property
    def append(self) -> bool:
        return self.name == APPEND_ONLY


@dataclass
class _Survey:
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


class ReplicaBuilder:
    """Builds the replicas of one pipeline config from its changelog."""

    def __init__(self, spark: SparkSession, config: PipelineConfig) -> None:
        # A session of our own: the transaction-id settings must not leak into the
        # caller's session (nor the caller's into ours). It shares the catalog.
        self.spark = new_session(spark, config)
        self.config = config
        self.database = config.lakehouse.database
        self._lock = threading.Lock()

    def table_name(self, replica: str) -> tuple[str, str]:
        return self.database, replica

    def current_view_name(self, replica: str) -> tuple[str, str]:
        return self.database, f"{replica}_current"

    def history_name(self, replica: str) -> tuple[str, str]:
        return self.database, f"{replica}_history"

    def applied_version(self, replica: str) -> int | None:
        """The changelog version the replica reflects; None before its first apply."""
        return txn_version(self.spark, *self.table_name(replica), APP_ID)

    def rebuild(self, replica: str) -> ReplicaResult:
        """Drop the replica (and its view and history) and apply the whole changelog."""
        route = replica_route(self.config, replica)
        self.spark.sql(f"DROP VIEW IF EXISTS {qualified(*self.current_view_name(replica))}")
        tables = [self.table_name(replica)]
        if route.history:
            tables.append(self.history_name(replica))
        for table in tables:
            self.spark.sql(f"DROP TABLE IF EXISTS {qualified(*table)}")
            forget(self.spark, *table)
        return self.apply(replica)

    def apply(self, replica: str, *, up_to_version: int | None = None) -> ReplicaResult:
        """Apply changelog versions above the replica's applied version, up to `up_to_version`
        (default: the changelog's current version)."""
        with self._lock:
            return self._apply(replica_route(self.config, replica), up_to_version)

    # -- the steps of one apply ---------------------------------------------------------

    def _apply(self, route: ReplicaRoute, up_to_version: int | None) -> ReplicaResult:
        spark = self.spark
        up_to = changelog_version(spark, self.config) if up_to_version is None else up_to_version
        replica_table = self.table_name(route.replica)
        props, files, location = (self._detail(replica_table)
                                  if table_exists(spark, *replica_table) else ({}, 0, ""))
        stored_rule = _stored_rule(route, props)
        targets = [replica_table]
        if route.history and stored_rule != APPEND_ONLY:
            targets.append(self.history_name(route.replica))
        applied = {t: txn_version(spark, *t, APP_ID) for t in targets}
        behind = [t for t in targets if applied[t] is None or applied[t] < up_to]
        if up_to < 0 or not behind:
            done = applied[targets[0]]
            return ReplicaResult(route.replica, applied_version=-1 if done is None else done,
                                 skipped=True, key_rule=stored_rule,
                                 warning=_fallback_warning(route, stored_rule))
        starts = [applied[t] for t in behind]
        start = None if None in starts else min(starts)

        batch = read_changelog(spark, self.config, start, up_to)
        survey = self._survey(batch, route, start, up_to)
        rule = self._rule(route, survey, props) if survey.tables else None
        if rule is None or (not survey.rows and not props):
            # Nothing for this replica (or only truncates of a table whose key is not
            # known yet, which leave nothing to build). An empty MERGE would move its
            # applied version (a commit, seconds of Spark jobs); while the commits the
            # next apply surveys again are few, their metadata answers at once and the
            # commit can wait.
            existing = [t for t in behind if table_exists(spark, *t)]
            done = ReplicaResult(route.replica, applied_version=up_to if existing else -1,
                                 key_rule=stored_rule,
                                 warning=_fallback_warning(route, stored_rule))
            if start is not None and up_to - start < SURVEY_MAX_COMMITS // 2:
                return done
            for target in existing:
                self._commit_empty(target, up_to)
            return done

        now = datetime.now(UTC)
        key = rule.key
        changes = self._prepare_tables(route, survey, rule)
        columns = self._source_columns(replica_table)
        if rule.append:
            from binlog_assets.lakehouse.append_replica import append_changes

            rows = self._keyed(batch.where(F.col("table").isin(survey.tables)
                                           & F.col("op").isin(*MERGED_OPS)),
                               route, survey, [], columns, _row_image(), F.col("op"),
                               image_first=False)
            stored_columns = self.spark.table(".".join(replica_table)).columns
            fault_point("during_replica_merge")
            written = append_changes(
                spark, replica_table, rows,
                lambda frame: self._typed(frame, survey, [], columns, stored_columns),
                up_to, now, lambda: self._txn(up_to), empty=files == 0)
            return self._result(route, survey, up_to, rule, changes, written=written)

        rows = self._keyed_rows(batch, route, survey, key, columns)
        if route.history:
            from binlog_assets.lakehouse.history import merge_history

            rows = rows.persist()
        try:
            written = truncated = 0
            if replica_table in behind:
                written, truncated = self._merge_replica(route, rows, survey, key, columns,
                                                         up_to, now, props, location,
                                                         empty=files == 0)
            history_table = self.history_name(route.replica)
            if route.history and history_table in behind:
                typed = self._typed(rows, survey, key, columns,
                                    [*SOURCE_KEY_COLUMNS, *columns, "_position", "_op",
                                     "_source_ts"])
                with self._txn(up_to):
                    merge_history(spark, history_table, typed, key, survey.truncates, now)
        finally:
            if route.history:
                rows.unpersist()
        return self._result(route, survey, up_to, rule, changes, written=written,
                            truncated=truncated,
                            tombstones=self._purge(replica_table, now, props))

    def _result(self, route: ReplicaRoute, survey: _Survey, up_to: int, rule: _Rule,
                changes: list[str], **counts: int) -> ReplicaResult:
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
            **counts,
        )

    def _survey(self, batch: DataFrame, route: ReplicaRoute, start: int | None, up_to: int
                ) -> _Survey:
        """Tables, types, keys and truncates of the batch: from the surveys its commits
        carry in the Delta log (`changelog.read_survey`), else in one aggregate job."""
        groups = read_survey(self.spark, self.config, start, up_to)
        if groups is None:
            groups = survey_of_frame(batch)
        tables = route.select({g[0] for g in groups})
        survey = _Survey(tables, 0, None, {}, {}, set(), {})
        routed = set(tables)
        # Earliest first, so that the column order of a new table is the source's.
        for table, op, column_types, value_types, key_columns, n, last in sorted(
                groups, key=lambda g: g[6]):
            if table not in routed:
                continue
            last = tuple(last)
            if op in LIVE_OPS:
                survey.upserts += n
            elif op == OP_DELETE:
                survey.deletes += n
            if op in MERGED_OPS:
                survey.rows += n
                if survey.last_position is None or last > survey.last_position:
                    survey.last_position = last
            if op == OP_TRUNCATE:
                current = survey.truncates.get(table)
                survey.truncates[table] = last if current is None else max(current, last)
            if op in ROW_OPS and key_columns:
                survey.key_columns.add(tuple(key_columns))
            for types, target in ((column_types, survey.declared),
                                  (value_types, survey.inferred)):
                if types:
                    widen_all(target, {c: spark_type(t) for c, t in json.loads(types).items()})
        return survey

    def _rule(self, route: ReplicaRoute, survey: _Survey, props: dict[str, str]
              ) -> _Rule | None:
        """The replica's key rule: `replica_mode: append`, else `key_columns`, else the
        primary key the changes carry, else (a table without one) append-only with a
        warning saying what to set; None while neither the batch nor the table knows.

        A replica keeps the rule it was built with. A config that asks for another fails
        with the way out (a rebuild); a source that gains or loses its primary key does
        not fail the build.
        """
        stored = json.loads(props.get(KEY_PROPERTY, "null"))
        stored_rule = _stored_rule(route, props)
        if route.replica_mode == "append":
            if stored_rule not in (None, APPEND_ONLY):
                raise ReplicaError(
                    f"replica {route.replica!r} is keyed on {stored}, and its config now says "
                    "replica_mode: append: rebuild it (build_replicas_job with "
                    "ops.replicas.config.rebuild: true) to make it the log of changes")
            return _Rule(APPEND_ONLY, [])
        if route.key_columns:
            name, source_key = KEY_COLUMNS, tuple(route.key_columns)
        elif len(survey.key_columns) == 1:
            name, (source_key,) = PRIMARY_KEY, survey.key_columns
        elif len(survey.key_columns) > 1:
            raise ReplicaError(
                f"replica {route.replica!r}: its source tables disagree on the primary key "
                f"({sorted(survey.key_columns)}); set key_columns in the table config")
        elif stored_rule == APPEND_ONLY:
            return _Rule(APPEND_ONLY, [], _fallback_warning(route, APPEND_ONLY))
        elif stored_rule is not None:
            name, source_key = stored_rule, tuple(stored)  # no key in this batch
        elif survey.upserts or survey.deletes:
            return _Rule(APPEND_ONLY, [], _fallback_warning(route, APPEND_ONLY))
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
            return _Rule(APPEND_ONLY, [], (
                f"{_fallback_warning(route, APPEND_ONLY)}. Its changes now carry the primary "
                f"key {list(source_key)}: rebuild the replica to key it by that"))
        check_columns(source_key, route.replica)
        if stored is not None and tuple(stored) != source_key:
            raise ReplicaError(
                f"replica {route.replica!r} is keyed on {stored}, its changes now on "
                f"{list(source_key)}: rebuild it (ReplicaBuilder.rebuild) after the "
                "source's primary key change")
        key = [*SOURCE_KEY_COLUMNS, *source_key] if route.sharded else list(source_key)
        return _Rule(name, key)

    def _detail(self, table: tuple[str, str]) -> tuple[dict[str, str], int, str]:
        """The table's properties, its number of data files and its location."""
        detail = table_detail(self.spark, *table)
        return (dict(detail["properties"] or {}), int(detail["numFiles"] or 0),
                str(detail["location"]))

    def _prepare_tables(self, route: ReplicaRoute, survey: _Survey, rule: _Rule
                        ) -> list[str]:
        """Create or evolve the replica (and history) for the batch's columns.

        Returns a description of each change made. Schema changes commit before the MERGE;
        they are idempotent, so a crash in between is harmless. An append-only replica has
        neither a history (it is one) nor a view of live rows (without a key there are
        none to tell apart).
        """
        source_key = [k for k in rule.key if k not in SOURCE_KEY_COLUMNS]
        missing = [k for k in source_key if k not in survey.declared
                   and k not in survey.inferred]
        table = self.table_name(route.replica)
        exists = table_exists(self.spark, *table)
        if not exists and missing:
            raise ReplicaError(f"replica {route.replica!r}: no type known for key column(s) "
                               f"{missing} in {survey.tables[:5]}")
        current = self._source_columns(table) if exists else {}
        # A new table takes every column of the batch, whatever the mode: there is no
        # schema yet to keep.
        change = plan_changes(current, survey.declared, survey.inferred,
                              route.schema_evolution if exists else "evolve", route.replica)
        described = [f"add {f.name} {f.dataType.simpleString()}" for f in change.add]
        described += [f"widen {n} {o.simpleString()} -> {t.simpleString()}"
                      for n, o, t in change.retype]
        targets = [table]
        if route.history and not rule.append:
            targets.append(self.history_name(route.replica))
        for target in targets:
            if not table_exists(self.spark, *target):
                self._create(target, route, source_key, change, rule.name,
                             history=target != table)
            elif change:
                apply_changes(self.spark, target, change)
        if (change or not exists) and not rule.append:
            self._create_view(route.replica)
        return described

    def _create(self, target: tuple[str, str], route: ReplicaRoute, source_key: list[str],
                change: SchemaChange, rule: str, *, history: bool) -> None:
        from binlog_assets.lakehouse.history import HISTORY_METADATA

        columns = change.columns
        ordered = [*source_key, *(c for c in columns if c not in source_key)]
        schema = T.StructType(
            [T.StructField(c, T.StringType()) for c in SOURCE_KEY_COLUMNS]
            + [T.StructField(c, columns[c]) for c in ordered]
            + [T.StructField(n, t) for n, t in (HISTORY_METADATA if history
                                                 else REPLICA_METADATA)])
        properties = {KEY_PROPERTY: json.dumps(source_key), RULE_PROPERTY: rule,
                      SHARDED_PROPERTY: str(route.sharded).lower()}
        if not history:
            # A new table has no tombstone to purge for a while.
            properties[PURGED_PROPERTY] = f"{datetime.now(UTC).timestamp():.3f}"
        create_table(self.spark, target, schema, {**properties, **_TABLE_PROPERTIES})

    def _create_view(self, replica: str) -> None:
        # Spark fixes a view's columns when it is created, so it is re-created whenever
        # the replica's columns change. Only config-validated names are in this text.
        self.spark.sql(
            f"CREATE OR REPLACE VIEW {qualified(*self.current_view_name(replica))} AS "
            f"SELECT * FROM {qualified(*self.table_name(replica))} "
            f"WHERE _op NOT IN ('{OP_DELETE}', '{OP_TRUNCATE}')")

    def _source_columns(self, table: tuple[str, str]) -> dict[str, T.DataType]:
        """The replica's key and source columns with their types, in table order."""
        schema = self.spark.table(".".join(table)).schema
        return {f.name: f.dataType for f in schema if f.name not in METADATA_COLUMNS}

    def _keyed_rows(self, batch: DataFrame, route: ReplicaRoute, survey: _Survey,
                    key: list[str], columns: dict[str, T.DataType]) -> DataFrame:
        """The batch's row changes and truncates with their key typed and their image
        still JSON text, so that only the changes that survive the reduce get parsed.

        Columns: `_source_db`, `_source_table`, the key's source columns, `_position`,
        `_op`, `_source_ts`, `_IMAGE` (the after-image, the before-image of a delete).
        Truncates have null keys. The key comes from the record's own key (`key`, a small
        JSON object the decoder took from the same image) and from the image only when the
        record has none; with a `key_columns` override it comes from the image (the record
        key is the decoder's), and updates that moved a row to another key add a delete of
        the old one (`_key_change_deletes`).
        """
        b = batch.where(F.col("table").isin(survey.tables) & F.col("op").isin(*MERGED_OPS))
        keyed = self._keyed(b, route, survey, key, columns, _row_image(), F.col("op"),
                            image_first=bool(route.key_columns))
        if route.key_columns:
            keyed = keyed.unionByName(self._key_change_deletes(b, route, survey, key, columns))
        return keyed

    def _keyed(self, b: DataFrame, route: ReplicaRoute, survey: _Survey, key: list[str],
               columns: dict[str, T.DataType], image: Column, op: Column, *,
               image_first: bool) -> DataFrame:
        source_key = [k for k in key if k not in SOURCE_KEY_COLUMNS]
        spellings = _spellings({k: columns[k] for k in source_key}, survey)
        in_record = F.from_json(F.col("key"), _text_schema({k: [k] for k in source_key}))
        in_image = F.from_json(col(_IMAGE), _text_schema(spellings))
        framed = b.select(
            F.col("table"), F.col("offset"), F.col("key"), image.alias(_IMAGE),
            op.alias("_op"), changelog_position().alias("_position"),
            F.timestamp_millis(F.col("source_ts")).alias("_source_ts"))
        table_parts = F.split(F.col("table"), r"\.", 2)
        out = [table_parts.getItem(0).alias("_source_db"),
               table_parts.getItem(1).alias("_source_table")]
        for column in source_key:
            from_image = [in_image.getField(n) for n in spellings[column.lower()]]
            from_record = [in_record.getField(column)]
            # Coalesce stops at its first non-null argument: the second source is parsed
            # only for rows whose first lacks the value.
            text = F.coalesce(*(from_image + from_record if image_first
                                else from_record + from_image))
            value = _cast_text(_require_key(text, column, route.replica), columns[column])
            fast = None if image_first or len(source_key) != 1 else _integer_key(
                column, columns[column])
            # Coalesce evaluates `value` (the JSON parse) only where `fast` is null.
            out.append((value if fast is None else F.coalesce(fast, value)).alias(column))
        return framed.select(*out, "_position", "_op", "_source_ts", col(_IMAGE))

    def _key_change_deletes(self, b: DataFrame, route: ReplicaRoute, survey: _Survey,
                            key: list[str], columns: dict[str, T.DataType]) -> DataFrame:
        """Deletes of the old key of updates that moved a row to another key.

        Only needed with a key_columns override: decoders split such updates themselves
        when they know the key, but an override of a sharded (regex) source reaches no
        decoder.
        """
        source_key = [k for k in key if k not in SOURCE_KEY_COLUMNS]
        key_schema = _text_schema({k: [k] for k in source_key})
        before = F.from_json(F.col("before"), key_schema)
        after = F.from_json(F.col("after"), key_schema)
        moved = F.lit(False)
        for k in source_key:
            moved = moved | ~before.getField(k).eqNullSafe(after.getField(k))
        updates = b.where((F.col("op") == OP_UPDATE) & F.col("before").isNotNull() & moved)
        return self._keyed(updates, route, survey, key, columns, F.col("before"),
                           F.lit(OP_DELETE), image_first=True)

    def _typed(self, frame: DataFrame, survey: _Survey, key: list[str],
               columns: dict[str, T.DataType], out: list[str],
               stored: Column | None = None, image: str = _IMAGE) -> DataFrame:
        """`frame`'s columns `out`, the replica's source columns among them parsed from
        the JSON column `image` and typed (those of rows where `stored` holds are kept as
        they are)."""
        spellings = _spellings(columns, survey)
        parsed = frame.withColumn(image, F.from_json(col(image), _text_schema(spellings)))
        # Parsed once into a struct column and only then taken apart: a field read
        # straight off `from_json(...)` makes Spark parse the text once per field.
        select = []
        for name in out:
            if name in columns and name not in key:
                text = F.coalesce(*[col(image).getField(n) for n in spellings[name.lower()]])
                value = _cast_text(text, columns[name])
                if stored is not None:
                    value = F.when(stored, col(name)).otherwise(value)
                select.append(value.alias(name))
            else:
                select.append(col(name))
        return parsed.select(*select)

    def _watermarks(self, table: tuple[str, str], survey: _Survey, props: dict[str, str]
                    ) -> list[tuple]:
        """(db, table, position) of every truncate: stored markers and the batch's."""
        marks: dict[tuple[str, str], tuple[int, ...]] = {}
        if props.get(TRUNCATED_PROPERTY) == "true":
            stored = (self.spark.table(".".join(table)).where(F.col("_op") == OP_TRUNCATE)
                      .select("_source_db", "_source_table", "_position").collect())
            for r in stored:
                marks[(r["_source_db"], r["_source_table"])] = tuple(r["_position"])
        for name, position in survey.truncates.items():
            k = split_table(name)
            marks[k] = max(marks.get(k, position), position)
        return [(db, t, p) for (db, t), p in marks.items()]

    def _merge_replica(self, route: ReplicaRoute, rows: DataFrame, survey: _Survey,
                       key: list[str], columns: dict[str, T.DataType], up_to: int,
                       now: datetime, props: dict[str, str], location: str, *, empty: bool
                       ) -> tuple[int, int]:
        """Reduce per key, MERGE with the position guard; (rows written, rows truncated).

        `rows` are `_keyed_rows`: the images are parsed after the reduce, for the changes
        that won it only.
        """
        table = self.table_name(route.replica)
        if survey.truncates and props.get(TRUNCATED_PROPERTY) != "true":
            # Set once, before the first marker lands, so that applies of replicas that
            # were never truncated skip looking for markers.
            self.spark.sql(f"ALTER TABLE {qualified(*table)} SET TBLPROPERTIES "
                           f"('{TRUNCATED_PROPERTY}' = 'true')")
        marks = self._watermarks(table, survey, props)
        if marks:
            # Changes below their table's latest truncate are gone at the source already.
            wm = self.spark.createDataFrame(
                marks, T.StructType([T.StructField(_WM_DB, T.StringType()),
                                     T.StructField(_WM_TABLE, T.StringType()),
                                     T.StructField(_WM, POSITION_TYPE)]))
            rows = (rows.join(F.broadcast(wm), (F.col("_source_db") == col(_WM_DB))
                              & (F.col("_source_table") == col(_WM_TABLE)), "left")
                    .where((F.col("_op") == OP_TRUNCATE) | col(_WM).isNull()
                           | (F.col("_position") > col(_WM)))
                    .drop(_WM_DB, _WM_TABLE, _WM))
        name = ".".join(table)
        fault_point("during_replica_merge")
        if not empty and self._rewrites(table, survey):
            return self._rewrite_replica(table, location, rows, survey, key, columns, up_to,
                                         now)
        before = table_version(self.spark, *table)
        stored_columns = self.spark.table(name).columns
        reduced = (first_per_group(rows, [col(k) for k in key], [col("_position").desc()])
                   .withColumn("_applied_at", F.lit(now)))
        reduced = self._typed(reduced, survey, key, columns, stored_columns)
        if empty:
            # Nothing to match: the reduced batch is the table's content, appended with the
            # same transaction id (an initial build or a rebuild, without MERGE's joins).
            (reduced.write.format("delta").mode("append")
             .option("txnAppId", APP_ID).option("txnVersion", up_to).saveAsTable(name))
            metrics = metrics_since(self.spark, *table, before)
            return int(metrics.get("numOutputRows", 0)), 0
        t, s = merge_aliases(table)
        assignments = {qualified(c): col(c, s) for c in reduced.columns}
        merge = (reduced.alias(s).mergeInto(qualified(*table), key_match(key, t, s))
                 .whenMatched(col("_position", s) > col("_position", t)).update(assignments)
                 .whenNotMatched().insert(assignments))
        if survey.truncates:
            merge = (merge.whenNotMatchedBySource(_below_truncates(survey.truncates, t))
                     .delete())
        with self._txn(up_to):
            merge.merge()
        metrics = metrics_since(self.spark, *table, before)
        written = (int(metrics.get("numTargetRowsInserted", 0))
                   + int(metrics.get("numTargetRowsMatchedUpdated", 0)))
        return written, int(metrics.get("numTargetRowsNotMatchedBySourceDeleted", 0))

    def _rewrites(self, table: tuple[str, str], survey: _Survey) -> bool:
        """Whether the batch is large enough against the replica to rewrite it rather
        than MERGE (`lakehouse.rewrite_ratio`). The replica's size comes from its log's
        file statistics (a Spark count was a job, 0.6-3.8 s of a one-row apply); rows
        hidden by deletion vectors count too, which only leans towards MERGE."""
        ratio = self.config.lakehouse.rewrite_ratio
        if ratio == 0:
            return True
        stored = stored_rows(self.spark, *table)
        if stored is None:
            stored = self.spark.table(".".join(table)).count()
        return survey.rows >= ratio * stored

    def _rewrite_replica(self, table: tuple[str, str], location: str, rows: DataFrame,
                         survey: _Survey, key: list[str], columns: dict[str, T.DataType],
                         up_to: int, now: datetime) -> tuple[int, int]:
        """The replica's rows and the batch's changes in one ranking per key, written
        back over the table in one commit; (rows written, rows truncated).

        The same outcome as the MERGE, in one shuffle and one write where MERGE takes a
        reduce, a materialized source, a join to find the files, a join to write them and
        deletion vectors. Each key keeps its highest `_position`, and on a tie the row
        already stored (so a re-applied range leaves every byte, `_applied_at` included,
        as it was: the guard's `>`); rows of a truncated table below its truncate are
        left out. Only the changes that win are parsed from their JSON image. The
        overwrite carries the same transaction id as a MERGE would.
        """
        stored = self.spark.table(".".join(table))
        names = stored.columns
        types = {f.name: f.dataType for f in stored.schema}
        # The working column takes a name no replica column has (a source column may be
        # called `_stored` too).
        image, from_table = _IMAGE, free_name("_stored", names)
        changes = rows.withColumn("_applied_at", F.lit(now))
        both = (stored.select(*[col(c) for c in names],
                              F.lit(None).cast(T.StringType()).alias(image),
                              F.lit(1).alias(from_table))
                .unionByName(changes.select(
                    *[col(c) if c in changes.columns
                      else F.lit(None).cast(types[c]).alias(c) for c in names],
                    col(image), F.lit(0).alias(from_table))))
        winners = first_per_group(both, [col(k) for k in key],
                                  [col("_position").desc(), col(from_table).desc()])
        winners = self._typed(winners, survey, key, columns, [*names, from_table],
                              stored=col(from_table) == 1, image=image)
        cleared = _below_truncates(survey.truncates)
        from pyspark.sql import Observation

        counts = Observation("binlake_rewrite")
        winners = winners.observe(
            counts,
            F.sum(F.when(~cleared & (col(from_table) == 0), 1).otherwise(0)).alias("written"),
            F.sum(F.when(cleared, 1).otherwise(0)).alias("truncated"))
        before = table_version(self.spark, *table)
        (winners.where(~cleared).select(*[col(c) for c in names])
         .write.format("delta").mode("overwrite")
         .option("txnAppId", APP_ID).option("txnVersion", up_to).save(location))
        if table_version(self.spark, *table) == before:
            return 0, 0  # this changelog version was recorded first: Delta skipped ours
        got = counts.get
        return int(got.get("written") or 0), int(got.get("truncated") or 0)

    def _commit_empty(self, target: tuple[str, str], up_to: int) -> None:
        empty = self.spark.table(qualified(*target)).limit(0)
        first = empty.columns[0]
        t, s = merge_aliases(target)
        merge = (empty.alias(s).mergeInto(qualified(*target), col(first, t) == col(first, s))
                 .whenNotMatched().insert({qualified(first): col(first, s)}))
        with self._txn(up_to):
            merge.merge()

    def _purge(self, table: tuple[str, str], now: datetime, props: dict[str, str]) -> int:
        """Delete tombstones older than the window, when the last purge is old enough;
        returns how many. Delta prunes files by the `_applied_at` statistics and commits
        nothing when no row matches."""
        if not props:
            return 0  # the table was created by this apply
        window = timedelta(hours=self.config.lakehouse.tombstone_retention_hours)
        last = float(props.get(PURGED_PROPERTY, "0"))
        if now.timestamp() - last < (window * PURGE_EVERY).total_seconds():
            return 0
        before = table_version(self.spark, *table)
        # The session time zone is UTC (spark_conf), as the literal is read in it.
        cutoff = (now - window).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
        self.spark.sql(f"DELETE FROM {qualified(*table)} WHERE _op = '{OP_DELETE}' "
                       f"AND _applied_at < TIMESTAMP '{cutoff}'")
        purged = int(metrics_since(self.spark, *table, before).get("numDeletedRows", 0))
        self.spark.sql(f"ALTER TABLE {qualified(*table)} SET TBLPROPERTIES "
                       f"('{PURGED_PROPERTY}' = '{now.timestamp():.3f}')")
        return purged

    def _txn(self, version: int) -> _Txn:
        return _Txn(self.spark, version)


class _Txn:
    """Within the block, Delta DML commits carry (APP_ID, version) and are skipped when
    the table already recorded that version or a later one."""

    def __init__(self, spark: SparkSession, version: int) -> None:
        self.spark = spark
        self.version = version

    def __enter__(self) -> None:
        self.spark.conf.set(_TXN_APP_ID, APP_ID)
        self.spark.conf.set(_TXN_VERSION, str(self.version))

    def __exit__(self, *exc: Any) -> None:
        self.spark.conf.unset(_TXN_APP_ID)
        self.spark.conf.unset(_TXN_VERSION)


def _stored_rule(route: ReplicaRoute, props: dict[str, str]) -> str | None:
    """The key rule the replica was built with (from its table properties); None when
    there is no table yet. Replicas built before the rule was recorded are keyed."""
    if not props:
        return None
    return props.get(RULE_PROPERTY) or (KEY_COLUMNS if route.key_columns else PRIMARY_KEY)


def _fallback_warning(route: ReplicaRoute, rule: str | None) -> str | None:
    """What to set when a replica is append-only only because its changes carry no key."""
    if rule != APPEND_ONLY or route.replica_mode == "append":
        return None
    return (f"replica {route.replica!r}: the changes of its source table(s) carry no primary "
            "key, so the replica is the append-only log of their changes (a row per change). "
            "For a row per source row set key_columns: [<unique, never-null columns>] in the "
            "table config and rebuild the replica; to keep the log and silence this, set "
            "replica_mode: append")


def _row_image() -> Column:
    """A change's row values: the after-image, the before-image of a delete."""
    return F.when(F.col("op") == OP_DELETE, F.col("before")).otherwise(F.col("after"))


def _below_truncates(truncates: dict[str, tuple[int, ...]], alias: str | None = None
                     ) -> Column:
    """The row (of DataFrame `alias`) comes from a truncated source table and is older
    than its truncate: `truncates` maps db.table to the truncate's position."""
    cleared = F.lit(False)
    for name, position in truncates.items():
        cleared = cleared | (is_source_table(name, alias)
                             & (col("_position", alias) < position_literal(position)))
    return cleared


def _cast_text(text: Column, data_type: T.DataType) -> Column:
    """A value's JSON text (see changelog.to_json) as `data_type`."""
    if isinstance(data_type, T.BinaryType):
        return F.unbase64(text)
    if isinstance(data_type, T.StringType):
        return text
    return text.cast(data_type)


def _require_key(value: Column, column: str, replica: str) -> Column:
    """`value`, or a clear job failure for a row change without a key value (a null key
    would collide with the truncate markers)."""
    message = F.concat(F.lit(f"replica {replica}: a change of "), F.col("table"),
                       F.lit(" at offset "), F.col("offset").cast("string"),
                       F.lit(f" has no value for key column {column!r}"))
    # `value` appears once: written into both the test and the result of a CASE, Spark
    # evaluated it twice (a key parsed from JSON twice per row, 1.2 s per 1M events).
    return F.coalesce(value, F.when(F.col("_op") != OP_TRUNCATE, F.raise_error(message)))


_INTEGER_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


def _integer_key(column: str, data_type: T.DataType) -> Column | None:
    """The value of an integer key column read straight from a record key that is just
    `{"<column>":<integer>}` (what the changelog writer writes for a one-column key),
    null for any other record key; None when `data_type` is not an integer type.

    Reading the digits between the braces costs about a fifth of `from_json` per row (the
    record key is parsed for every change of the batch) and gives the same value: the
    digits must be the number's own canonical text (no sign but minus, no leading zero,
    no space), and a number that does not fit the type is null here and left to the
    parse and its cast, as before.
    """
    if not isinstance(data_type, _INTEGER_TYPES):
        return None
    # The writer's own encoding of the key, up to the value: `{"<column>":`.
    prefix = to_json({column: 0}).removesuffix("0}")
    record_key = F.col("key")
    start = len(prefix) + 1
    digits = record_key.substr(F.lit(start), F.length(record_key) - F.lit(start))
    value = digits.try_cast(data_type)
    whole = (record_key.startswith(prefix) & record_key.endswith("}")
             & (value.cast(T.StringType()) == digits))
    return F.when(whole, value)


def _spellings(columns: dict[str, T.DataType], survey: _Survey) -> dict[str, list[str]]:
    """Per replica column (by its lower-case name), every spelling the batch uses for it,
    so a column whose case changed still finds its replica column (Spark and MySQL names
    are case-insensitive)."""
    spellings: dict[str, list[str]] = {c.lower(): [c] for c in columns}
    for name in [*survey.declared, *survey.inferred]:
        names = spellings.get(name.lower())
        if names is not None and name not in names:
            names.append(name)
    return spellings


def _text_schema(spellings: dict[str, list[str]]) -> T.StructType:
    """Every spelling as a string field: values are parsed as JSON text, then cast."""
    return T.StructType([T.StructField(n, T.StringType())
                         for names in spellings.values() for n in names])
