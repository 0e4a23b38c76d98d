"""Silver replicas: `ReplicaBuilder.apply` makes each replica table equal its source
tables as of the last applied position, one Delta commit per apply.

How an apply reads, reduces, types and writes a batch, and the replica table's columns:
docs/architecture.md, "A replica apply".
"""

from __future__ import annotations

import json
import threading
from contextlib import suppress
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql import types as T

from binlog_assets.config import PipelineConfig
from binlog_assets.faults import fault_point
from binlog_assets.formats.event import OP_DELETE, OP_TRUNCATE
from binlog_assets.identifiers import check_unmapped_names, col, qualified
from binlog_assets.lakehouse.changelog_reader import (
    LazyRange,
    changelog_version,
    read_changelog,
    register_changelog,
)
from binlog_assets.lakehouse.changelog_rows import SURVEY_MAX_COMMITS
from binlog_assets.lakehouse.columns import POSITION_TYPE
from binlog_assets.lakehouse.ddl import DdlPlan
from binlog_assets.lakehouse.delta_log import (
    NewTable,
    TableCreatedMeanwhile,
    create_table,
    forget,
    known_views,
    log_scope,
    merge_aliases,
    open_log,
    share_lookups,
    table_detail,
    table_exists,
    table_location,
    table_schema,
    txn_version,
)
from binlog_assets.lakehouse.maintenance import PURGED_PROPERTY, purge_tombstones
from binlog_assets.lakehouse.replica import merge as replica_merge
from binlog_assets.lakehouse.replica.arrow_apply import (
    NeedsSpark,
    above_marks,
    arrow_applies,
    arrow_rows,
    batch_changes,
    history_changes,
)
from binlog_assets.lakehouse.replica.arrow_commit import (
    arrow_commits,
    commit_appended,
    commit_arrow,
    commit_version,
)
from binlog_assets.lakehouse.replica.cutover import (
    CUTOVERS_PROPERTY,
    Cutover,
    cutover_rows,
    plan_cutovers,
    record_cutovers,
)
from binlog_assets.lakehouse.replica.ddl_apply import (
    SOURCES_PROPERTY,
    Sources,
    apply_ddl,
    drop_markers,
    move_batch_rows,
    note_adds,
    read_ddl,
    record_sources,
    replica_sources,
    shape_new_table,
)
from binlog_assets.lakehouse.replica.history_arrow import merge_history_versions
from binlog_assets.lakehouse.replica.plan import (
    APPEND_ONLY,
    KEY_PROPERTY,
    MERGED_OPS,
    RULE_PROPERTY,
    SHARDED_PROPERTY,
    TRUNCATED_PROPERTY,
    KeyRule,
    ReplicaError,
    ReplicaResult,
    ReplicaTable,
    RowShape,
    Stamp,
    Survey,
    Versions,
    fallback_warning,
    feature_properties,
    key_rule,
    recorded_rule,
    survey_batch,
)
from binlog_assets.lakehouse.replica.routes import SOURCE_KEY_COLUMNS, ReplicaRoute, replica_route
from binlog_assets.lakehouse.replica.rows import (
    keyed_changes,
    keyed_rows,
    row_image,
    typed_columns,
)
from binlog_assets.lakehouse.schema import (
    SchemaChange,
    apply_changes,
    plan_changes,
)
from binlog_assets.lakehouse.spark import INTERPRET_ROWS, Evaluation, new_session
from binlog_assets.lakehouse.transactions import APP_ID, SparkTxn

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


REPLICA_METADATA = (
    ("_position", POSITION_TYPE),
    ("_op", T.StringType()),
    ("_source_ts", T.TimestampType()),
    ("_applied_at", T.TimestampType()),
)
METADATA_COLUMNS = frozenset({*SOURCE_KEY_COLUMNS, *(n for n, _ in REPLICA_METADATA),
                              "_valid_from", "_valid_to", "_is_current"})


class ReplicaBuilder:
    """Builds the replicas of one pipeline config from its changelog."""

    def __init__(self, spark: SparkSession, pipeline: PipelineConfig) -> None:
        # A session of our own: the transaction-id settings must not leak into the
        # caller's session (nor the caller's into ours). It shares the catalog.
        self.spark = new_session(spark, pipeline)
        share_lookups(spark, self.spark)
        self.pipeline = pipeline
        self.database = pipeline.lakehouse.database
        self._evaluation = Evaluation(self.spark)
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
        route = replica_route(self.pipeline, replica)
        self.spark.sql(f"DROP VIEW IF EXISTS {qualified(*self.current_view_name(replica))}")
        known_views(self.spark).discard(self.current_view_name(replica))
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
        route = replica_route(self.pipeline, replica)
        with self._lock, log_scope():
            # Spark SQL, dbt and users name the changelog in the catalog, which an apply
            # by Arrow alone would never register (once per catalog and process).
            register_changelog(self.spark, self.pipeline)
            try:
                return self._apply(route, up_to_version)
            except TableCreatedMeanwhile:
                # Another builder created the replica first: apply on top of its table.
                return self._apply(route, up_to_version)

    # -- the steps of one apply ---------------------------------------------------------

    def _apply(self, route: ReplicaRoute, up_to_version: int | None) -> ReplicaResult:
        spark = self.spark
        up_to = changelog_version(spark, self.pipeline) if up_to_version is None else up_to_version
        table = self._found(route.replica)
        stored_rule = recorded_rule(route, table.props)
        applied = self._applied(route, stored_rule, table=table)
        behind = [t for t, version in applied.items() if version is None or version < up_to]
        if table.props and stored_rule != APPEND_ONLY:
            self._ensure_view(route.replica)
        if up_to < 0 or not behind:
            done = applied[table.name]
            return ReplicaResult(route.replica, applied_version=-1 if done is None else done,
                                 skipped=True, key_rule=stored_rule,
                                 warning=fallback_warning(route, stored_rule))
        starts = [applied[t] for t in behind]
        versions = Versions(None if None in starts else min(starts), up_to, behind)

        # Read by Spark only when the batch needs it: an Arrow apply reads it so.
        batch = LazyRange(lambda: read_changelog(spark, self.pipeline, versions.start, up_to))
        survey, ddl, cutovers = self._plan_batch(route, batch, stored_rule, table=table,
                                                 versions=versions)
        # A dropped database or a table renamed away names no table routed here.
        rule = key_rule(route, survey, table.props) if survey.tables or ddl else None
        if rule is None or (not survey.rows and not table.props):
            return self._nothing_to_apply(route, stored_rule, versions=versions)

        now = datetime.now(UTC)
        changes, sources, new = self._prepare_tables(route, survey, rule, ddl, table=table)
        new = record_cutovers(spark, table.name, table.props, cutovers, new)
        table = replace(table, new=new)
        columns = (self._source_columns(table.name) if table.new is None else
                   {f.name: f.dataType for f in table.new.schema
                    if f.name not in METADATA_COLUMNS})
        shape = RowShape(route, survey, rule.key, columns)
        if arrow_applies(rule, shape=shape, table=table, sources=sources, cutovers=cutovers,
                         limit=self.pipeline.lakehouse.arrow_commit_rows):
            with suppress(NeedsSpark):  # else Spark's way below, for the whole batch
                counts = self._arrow_apply(rule, shape=shape, table=table, versions=versions)
                return self._result(route, survey, up_to, rule, changes, **counts)
        if rule.append:
            written = self._append_rows(batch.frame(), up_to, now, shape=shape, table=table)
            return self._result(route, survey, up_to, rule, changes, written=written)
        # A new replica too: its rows are built under the names they have now.
        rows = self._keyed_rows(batch.frame(), ddl, sources, cutovers, shape=shape)
        changes += [c.describe() for c in cutovers]
        counts = self._write_rows(rows, now, shape=shape, table=table, versions=versions)
        return self._result(route, survey, up_to, rule, changes, **counts)

    def _found(self, replica: str) -> ReplicaTable:
        """The replica's table as the apply finds it."""
        name = self.table_name(replica)
        if not table_exists(self.spark, *name):
            return ReplicaTable(name, exists=False)
        props, files, location = self._detail(name)
        return ReplicaTable(name, True, props, files, location)

    def _applied(self, route: ReplicaRoute, stored_rule: str | None, *, table: ReplicaTable
                 ) -> dict[tuple[str, str], int | None]:
        """The changelog version each table the apply writes (the replica, its history)
        reflects; None before its first apply."""
        targets = [table.name]
        if route.history and stored_rule != APPEND_ONLY:
            targets.append(self.history_name(route.replica))
        return {t: txn_version(self.spark, *t, APP_ID) if table.exists or t != table.name
                else None for t in targets}

    def _plan_batch(self, route: ReplicaRoute, batch: LazyRange, stored_rule: str | None, *,
                    table: ReplicaTable, versions: Versions
                    ) -> tuple[Survey, DdlPlan, list[Cutover]]:
        """What the batch holds for the replica: its survey, its DDL, and the cut-overs of
        tables renamed into the replica."""
        spark, start, up_to = self.spark, versions.start, versions.up_to
        survey = survey_batch(spark, self.pipeline, batch.frame, route, start, up_to)
        # A small batch in one partition: its reduce then needs no shuffle (a stage and
        # a job of its own, most of a small apply's Spark time).
        batch.single = survey.rows <= self.pipeline.lakehouse.arrow_commit_rows
        self._evaluation.interpret(survey.rows <= INTERPRET_ROWS)
        # A new replica (a first build, a rebuild) follows the DDL too: it is built as its
        # source tables are at the batch's end.
        ddl = read_ddl(batch.frame(), route) if survey.ddl else DdlPlan()
        note_adds(survey, ddl)
        # An append-only replica is the log of its tables' changes: a swap adds none.
        if not ((ddl.table_renames or CUTOVERS_PROPERTY in table.props)
                and stored_rule != APPEND_ONLY):
            return survey, ddl, []
        cutovers = plan_cutovers(
            ddl, route, survey, batch=batch.frame(), props=table.props,
            changelog=lambda: read_changelog(spark, self.pipeline, None, up_to))
        return survey, ddl, cutovers

    def _nothing_to_apply(self, route: ReplicaRoute, stored_rule: str | None, *,
                          versions: Versions) -> ReplicaResult:
        """Nothing for this replica (or truncates of a table whose key is not known yet).
        While the commits the next apply surveys again are few, their metadata answers at
        once and the commit moving its applied version can wait."""
        start, up_to = versions.start, versions.up_to
        existing = [t for t in versions.behind if table_exists(self.spark, *t)]
        done = ReplicaResult(route.replica, applied_version=up_to if existing else -1,
                             key_rule=stored_rule, warning=fallback_warning(route, stored_rule))
        if start is not None and up_to - start < SURVEY_MAX_COMMITS // 2:
            return done
        for target in existing:
            self._commit_empty(target, up_to)
        return done

    def _arrow_apply(self, rule: KeyRule, *, shape: RowShape, table: ReplicaTable,
                     versions: Versions) -> dict[str, int]:
        """The batch reduced and typed as Arrow (`arrow_apply.py`), committed by
        delta-rs; into a new replica after Spark's CREATE TABLE; its versions merged into
        the history table (`history_arrow.py`) when it has one behind. Returns the
        counts of the apply's result."""
        import pyarrow as pa

        now = datetime.now(UTC)
        route, survey, columns = shape.route, shape.survey, shape.columns
        new, location, up_to = table.new, table.location, versions.up_to
        schema = new.schema if new is not None else (
            pa.schema(open_log(location).schema().to_arrow()))
        batch = batch_changes(self.pipeline, versions.start, up_to, survey, rule)
        # The history keeps every version, as Spark's way does; a keyed replica drops
        # changes below its truncates, stored and the batch's, as Spark's apply does (an
        # append-only one logs them all).
        marks = ([] if rule.append
                 else replica_merge.watermarks(self.spark, table.name, survey, table.props))
        rows = arrow_rows(above_marks(batch, marks), survey, rule, columns, schema, now)
        history = self.history_name(route.replica)
        # Typed before any commit: a value only Spark types sends the whole batch there.
        history_rows = (history_changes(batch, survey, rule.key, columns, now)
                        if route.history and history in versions.behind else None)
        fault_point("during_replica_merge")
        if new is not None:
            create_table(self.spark, new.name, new.schema, new.properties, exists_ok=False)
            location = table_location(self.spark, *new.name)
        merge = new is None and not table.empty
        if rule.append:  # a log of changes: no live rows, no view, no tombstones
            return {"written": commit_appended(location, rows, APP_ID, up_to, merge=merge)}
        # Behind alone when a crash came between the replica's commit and its history's.
        written = (commit_arrow(location, rows, rule.key, APP_ID, up_to, merge=merge)
                   if table.name in versions.behind else 0)
        if new is not None:
            self._ensure_view(route.replica, create=True)
        if history_rows is not None:
            merge_history_versions(table_location(self.spark, *history), history_rows,
                                   rule.key, APP_ID, up_to)
        return {"written": written,
                "tombstones": purge_tombstones(
                    self.spark, table.name, now, table.props,
                    self.pipeline.lakehouse.tombstone_retention_hours)}

    def _append_rows(self, batch: DataFrame, up_to: int, now: datetime, *, shape: RowShape,
                     table: ReplicaTable) -> int:
        """The batch's changes appended to an append-only replica by Spark
        (`append_replica.py`); the rows written."""
        from binlog_assets.lakehouse.append_replica import append_changes

        survey = shape.survey
        rows = keyed_changes(batch.where(F.col("table").isin(survey.tables)
                                         & F.col("op").isin(*MERGED_OPS)),
                             row_image(), F.col("op"), shape=shape, image_first=False)
        stored_columns = (table_schema(self.spark, *table.name).names
                          if table.new is None else table.new.columns)
        fault_point("during_replica_merge")
        return append_changes(self.spark, rows,
                              lambda frame: typed_columns(frame, stored_columns, shape=shape),
                              table=table, version=up_to, now=now)

    def _keyed_rows(self, batch: DataFrame, ddl: DdlPlan, sources: Sources,
                    cutovers: list[Cutover], *, shape: RowShape) -> DataFrame:
        """The batch's rows for a keyed replica (`rows.keyed_rows`), with a truncate
        marker for each dropped table (`on_drop: truncate`) and the rows of each
        cut-over."""
        rows = keyed_rows(move_batch_rows(batch, ddl, shape.route, shape.survey), shape=shape)
        if shape.route.on_drop == "truncate":
            rows = drop_markers(self.spark, rows, sources, shape.survey)
        if cutovers:
            rows = cutover_rows(self.spark, rows, cutovers, shape=shape)
        return rows

    def _write_rows(self, rows: DataFrame, now: datetime, *, shape: RowShape,
                    table: ReplicaTable, versions: Versions) -> dict[str, int]:
        """The keyed rows merged into the replica and its history table, where behind.
        Returns the counts of the apply's result."""
        route, up_to = shape.route, versions.up_to
        if route.history:
            from binlog_assets.lakehouse.history import merge_history

            rows = rows.persist()
        try:
            written = truncated = 0
            if table.name in versions.behind:
                written, truncated = replica_merge.merge_replica(
                    self.spark, self.pipeline, rows, shape=shape, table=table,
                    stamp=Stamp(up_to, now))
            if table.new is not None:
                self._ensure_view(route.replica, create=True)
            history_table = self.history_name(route.replica)
            if route.history and history_table in versions.behind:
                typed = typed_columns(rows, [*SOURCE_KEY_COLUMNS, *shape.columns, "_position",
                                             "_op", "_source_ts"], shape=shape)
                with self._txn(up_to):
                    merge_history(self.spark, history_table, typed, shape.key,
                                  shape.survey.truncates, now)
        finally:
            if route.history:
                rows.unpersist()
        return {"written": written, "truncated": truncated,
                "tombstones": purge_tombstones(
                    self.spark, table.name, now, table.props,
                    self.pipeline.lakehouse.tombstone_retention_hours)}

    def _result(self, route: ReplicaRoute, survey: Survey, up_to: int, rule: KeyRule,
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
            last_source_ts=survey.last_source_ts,
            last_server_id=survey.last_origin[1] if survey.last_origin else None,
            last_gtid=survey.last_origin[2] if survey.last_origin else None,
            **counts,
        )

    def _detail(self, table: tuple[str, str]) -> tuple[dict[str, str], int, str]:
        """The table's properties, its number of data files and its location."""
        detail = table_detail(self.spark, *table)
        return (dict(detail["properties"] or {}), int(detail["numFiles"] or 0),
                str(detail["location"]))

    def _prepare_tables(self, route: ReplicaRoute, survey: Survey, rule: KeyRule,
                        ddl: DdlPlan, *, table: ReplicaTable
                        ) -> tuple[list[str], Sources, NewTable | None]:
        """Create or evolve the replica (and history) for the batch's columns, and do
        what its DDL asks of the replica's columns and rows (`ddl_apply.py`).

        Returns a description of each change made, the replica's source tables and, for
        a new replica, the table to create with its first rows. Schema changes commit
        before the rows, idempotently. An append-only replica has neither a history (it
        is one) nor a view of live rows.
        """
        source_key = [k for k in rule.key if k not in SOURCE_KEY_COLUMNS]
        missing = [k for k in source_key if k not in survey.declared
                   and k not in survey.inferred]
        name, exists = table.name, table.exists
        if not exists and missing:
            raise ReplicaError(f"replica {route.replica!r}: no type known for key column(s) "
                               f"{missing} in {survey.tables[:5]}")
        current = self._source_columns(name) if exists else {}
        sources = replica_sources(self.spark, survey, ddl, route, table=table)
        shaped = (shape_new_table(ddl, sources, survey, rule.key, route)
                  if ddl and not exists and not rule.append else [])
        # A new table takes every column the batch leaves it, whatever the mode: there is
        # no schema yet to keep.
        change = plan_changes(current, survey.declared, survey.inferred,
                              route.schema_evolution if exists else "evolve", route.replica)
        described = shaped + [f"add {f.name} {f.dataType.simpleString()}" for f in change.add]
        described += [f"widen {n} {o.simpleString()} -> {t.simpleString()}"
                      for n, o, t in change.retype]
        targets = [name]
        if route.history and not rule.append:
            targets.append(self.history_name(route.replica))
        new = None
        for target in targets:
            if target == name and not exists:
                new = self._new_table(target, route, rule, change, history=False,
                                      sources=sources)
                if survey.truncates or (sources.dropped and route.on_drop == "truncate"):
                    # Set with the first rows, as on an existing replica before its first
                    # marker lands (`merge.above_truncates`).
                    new = replace(new, properties={**new.properties,
                                                   TRUNCATED_PROPERTY: "true"})
            elif not table_exists(self.spark, *target):
                spec = self._new_table(target, route, rule, change, history=target != name,
                                       sources=sources)
                create_table(self.spark, target, spec.schema, spec.properties)
            elif change:
                mapped = "delta.columnMapping.mode" in table_detail(
                    self.spark, *target)["properties"]
                if change.add and not mapped:
                    check_unmapped_names([f.name for f in change.add], ".".join(target))
                apply_changes(self.spark, target, change)
        structural = False
        if exists and ddl and not rule.append:
            stored = RowShape(route, survey, rule.key, self._source_columns(name))
            described_ddl, structural = apply_ddl(self.spark, name, ddl, sources, shape=stored)
            described += described_ddl
        if exists:
            record_sources(self.spark, name, table.props, sources)
        if (change or structural) and exists and not rule.append:
            self._ensure_view(route.replica, create=True)
        return described, sources, new

    def _new_table(self, target: tuple[str, str], route: ReplicaRoute, rule: KeyRule,
                   change: SchemaChange, *, history: bool, sources: Sources) -> NewTable:
        """The schema and properties of a new replica (or history) table."""
        from binlog_assets.lakehouse.history import HISTORY_METADATA

        source_key = [k for k in rule.key if k not in SOURCE_KEY_COLUMNS]
        columns = change.columns
        ordered = [*source_key, *(c for c in columns if c not in source_key)]
        schema = T.StructType(
            [T.StructField(c, T.StringType()) for c in SOURCE_KEY_COLUMNS]
            + [T.StructField(c, columns[c]) for c in ordered]
            + [T.StructField(n, t) for n, t in (HISTORY_METADATA if history
                                                 else REPLICA_METADATA)])
        properties = {KEY_PROPERTY: json.dumps(source_key), RULE_PROPERTY: rule.name,
                      SHARDED_PROPERTY: str(route.sharded).lower()}
        if not history:
            properties[SOURCES_PROPERTY] = sources.property_value()
            # A new table has no tombstone to purge for a while.
            properties[PURGED_PROPERTY] = f"{datetime.now(UTC).timestamp():.3f}"
        features = self.pipeline.lakehouse.table_features
        if "column_mapping" not in features:
            check_unmapped_names([f.name for f in schema], ".".join(target))
        return NewTable(target, schema, {**properties, **feature_properties(features)})

    def _ensure_view(self, replica: str, *, create: bool = False) -> None:
        """(Re-)create the view of the replica's live rows when `create`, else when the
        catalog lacks it (a crash between the table's first commit and the view)."""
        view = self.current_view_name(replica)
        known = known_views(self.spark)
        if not create and (view in known or table_exists(self.spark, *view)):
            known.add(view)
            return
        # Spark fixes a view's columns when it is created, so it is re-created whenever
        # the replica's columns change. Only config-validated names are in this text.
        self.spark.sql(
            f"CREATE OR REPLACE VIEW {qualified(*self.current_view_name(replica))} AS "
            f"SELECT * FROM {qualified(*self.table_name(replica))} "
            f"WHERE _op NOT IN ('{OP_DELETE}', '{OP_TRUNCATE}')")
        known.add(view)

    def _source_columns(self, table: tuple[str, str]) -> dict[str, T.DataType]:
        """The replica's key and source columns with their types, in table order."""
        schema = table_schema(self.spark, *table)
        return {f.name: f.dataType for f in schema if f.name not in METADATA_COLUMNS}

    def _commit_empty(self, target: tuple[str, str], up_to: int) -> None:
        detail = table_detail(self.spark, *target)
        if arrow_commits(detail["properties"], 0, self.pipeline.lakehouse.arrow_commit_rows,
                         truncates=False):
            commit_version(detail["location"], APP_ID, up_to)
            return
        empty = self.spark.table(qualified(*target)).limit(0)
        first = empty.columns[0]
        t, s = merge_aliases(target)
        merge = (empty.alias(s).mergeInto(qualified(*target), col(first, t) == col(first, s))
                 .whenNotMatched().insert({qualified(first): col(first, s)}))
        with self._txn(up_to):
            merge.merge()

    def _txn(self, version: int) -> SparkTxn:
        return SparkTxn(self.spark, version)


