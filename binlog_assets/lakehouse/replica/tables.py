"""A replica's tables as an apply finds and shapes them: the replica, its history table
and the view of its live rows (`find_table`, `prepare_tables`, `ensure_view`), and the
empty commit that moves an applied version with no rows (`advance_empty`).

Schema changes commit before the rows, idempotently. An append-only replica has neither
a history (it is one) nor a view of live rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pyspark.sql import types as T

from binlog_assets.formats.event import OP_DELETE, OP_TRUNCATE
from binlog_assets.identifiers import check_unmapped_names, col, qualified
from binlog_assets.lakehouse.changelog_rows import SURVEY_MAX_COMMITS
from binlog_assets.lakehouse.columns import POSITION_TYPE
from binlog_assets.lakehouse.delta_log import (
    NewTable,
    create_table,
    found_detail,
    known_views,
    merge_aliases,
    table_detail,
    table_exists,
    table_schema,
    txn_version,
)
from binlog_assets.lakehouse.maintenance import PURGED_PROPERTY
from binlog_assets.lakehouse.replica.arrow_commit import arrow_commits, commit_version
from binlog_assets.lakehouse.replica.ddl_apply import (
    SOURCES_PROPERTY,
    Sources,
    apply_ddl,
    record_sources,
    replica_sources,
    shape_new_table,
)
from binlog_assets.lakehouse.replica.plan import (
    APPEND_ONLY,
    KEY_PROPERTY,
    RULE_PROPERTY,
    SHARDED_PROPERTY,
    TRUNCATED_PROPERTY,
    Found,
    KeyRule,
    ReplicaError,
    ReplicaResult,
    ReplicaTable,
    RowShape,
    Survey,
    Versions,
    fallback_warning,
    feature_properties,
    recorded_rule,
)
from binlog_assets.lakehouse.replica.routes import SOURCE_KEY_COLUMNS, ReplicaRoute
from binlog_assets.lakehouse.schema import SchemaChange, apply_changes, plan_changes
from binlog_assets.lakehouse.transactions import APP_ID, SparkTxn

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from binlog_assets.config import PipelineConfig
    from binlog_assets.lakehouse.replica.batch import BatchPlan


REPLICA_METADATA = (
    ("_position", POSITION_TYPE),
    ("_op", T.StringType()),
    ("_source_ts", T.TimestampType()),
    ("_applied_at", T.TimestampType()),
)
METADATA_COLUMNS = frozenset({*SOURCE_KEY_COLUMNS, *(n for n, _ in REPLICA_METADATA),
                              "_valid_from", "_valid_to", "_is_current"})


def history_name(database: str, replica: str) -> tuple[str, str]:
    return database, f"{replica}_history"


def view_name(database: str, replica: str) -> tuple[str, str]:
    return database, f"{replica}_current"


def find_table(spark: SparkSession, database: str, route: ReplicaRoute) -> Found:
    """The replica's tables as the apply finds them; the view of its live rows made
    again where a crash came between the table's first commit and the view."""
    name = (database, route.replica)
    detail = found_detail(spark, *name)
    table = (ReplicaTable(name, exists=False) if detail is None else
             ReplicaTable(name, True, dict(detail["properties"] or {}),
                          int(detail["numFiles"] or 0), str(detail["location"])))
    stored_rule = recorded_rule(route, table.props)
    targets = [table.name]
    if route.history and stored_rule != APPEND_ONLY:
        targets.append(history_name(database, route.replica))
    applied = {t: txn_version(spark, *t, APP_ID) if table.exists or t != table.name
               else None for t in targets}
    if table.props and stored_rule != APPEND_ONLY:
        ensure_view(spark, name)
    return Found(route, table, stored_rule, applied)


def ensure_view(spark: SparkSession, table: tuple[str, str], *, create: bool = False) -> None:
    """(Re-)create the view of the replica's live rows when `create`, else when the
    catalog lacks it (a crash between the table's first commit and the view)."""
    view = view_name(*table)
    known = known_views(spark)
    if not create and (view in known or table_exists(spark, *view)):
        known.add(view)
        return
    # Spark fixes a view's columns when it is created, so it is re-created whenever
    # the replica's columns change. Only config-validated names are in this text.
    spark.sql(
        f"CREATE OR REPLACE VIEW {qualified(*view)} AS "
        f"SELECT * FROM {qualified(*table)} "
        f"WHERE _op NOT IN ('{OP_DELETE}', '{OP_TRUNCATE}')")
    known.add(view)


def source_columns(spark: SparkSession, table: tuple[str, str]) -> dict[str, T.DataType]:
    """The replica's key and source columns with their types, in table order."""
    return {f.name: f.dataType for f in table_schema(spark, *table)
            if f.name not in METADATA_COLUMNS}


def advance_empty(spark: SparkSession, pipeline: PipelineConfig, route: ReplicaRoute,
                  stored_rule: str | None, *, versions: Versions) -> ReplicaResult:
    """Nothing for this replica (or truncates of a table whose key is not known yet).
    While the commits the next apply surveys again are few, their metadata answers at
    once and the commit moving its applied version can wait."""
    start, up_to = versions.start, versions.up_to
    existing = [t for t in versions.behind if table_exists(spark, *t)]
    done = ReplicaResult(route.replica, applied_version=up_to if existing else -1,
                         key_rule=stored_rule, warning=fallback_warning(route, stored_rule))
    if start is not None and up_to - start < SURVEY_MAX_COMMITS // 2:
        return done
    for target in existing:
        detail = table_detail(spark, *target)
        if arrow_commits(detail["properties"], 0, pipeline.lakehouse.arrow_commit_rows,
                         truncates=False):
            commit_version(detail["location"], APP_ID, up_to)
            continue
        empty = spark.table(qualified(*target)).limit(0)
        first = empty.columns[0]
        t, s = merge_aliases(target)
        merge = (empty.alias(s).mergeInto(qualified(*target), col(first, t) == col(first, s))
                 .whenNotMatched().insert({qualified(first): col(first, s)}))
        with SparkTxn(spark, up_to):
            merge.merge()
    return done


@dataclass(frozen=True)
class Prepared:
    """The replica's tables made ready for the batch's rows: a description of each
    change made, the replica's source tables, the table as the rows find it (`new` set
    for a replica created with its first rows) and the shape of its rows."""

    changes: list[str]
    sources: Sources
    table: ReplicaTable
    shape: RowShape


def prepare_tables(spark: SparkSession, pipeline: PipelineConfig, route: ReplicaRoute,
                   plan: BatchPlan, *, table: ReplicaTable) -> Prepared:
    """Create or evolve the replica (and history) for the batch's columns, and do what
    its DDL asks of the replica's columns and rows (`ddl_apply.py`); `plan.rule` is
    set."""
    survey, ddl, rule = plan.survey, plan.ddl, plan.rule
    assert rule is not None
    source_key = [k for k in rule.key if k not in SOURCE_KEY_COLUMNS]
    missing = [k for k in source_key if k not in survey.declared
               and k not in survey.inferred]
    name, exists = table.name, table.exists
    if not exists and missing:
        raise ReplicaError(f"replica {route.replica!r}: no type known for key column(s) "
                           f"{missing} in {survey.tables[:5]}")
    current = source_columns(spark, name) if exists else {}
    sources = replica_sources(spark, survey, ddl, route, table=table)
    shaped = (shape_new_table(ddl, sources, survey, rule.key, route)
              if ddl and not exists and not rule.append else [])
    # A new table takes every column the batch leaves it, whatever the mode: there is
    # no schema yet to keep.
    change = plan_changes(current, survey.declared, survey.inferred,
                          route.schema_evolution if exists else "evolve", route.replica)
    described = shaped + [f"add {f.name} {f.dataType.simpleString()}" for f in change.add]
    described += [f"widen {n} {o.simpleString()} -> {t.simpleString()}"
                  for n, o, t in change.retype]
    spec = TableSpec(route, rule, sources, pipeline.lakehouse.table_features)
    new = _create_or_evolve(spark, change, spec, survey=survey, table=table)
    structural = False
    if exists and ddl and not rule.append:
        stored = RowShape(route, survey, rule.key, source_columns(spark, name))
        described_ddl, structural = apply_ddl(spark, name, ddl, sources, shape=stored)
        described += described_ddl
    if exists:
        record_sources(spark, name, table.props, sources)
    if (change or structural) and exists and not rule.append:
        ensure_view(spark, name, create=True)
    table = replace(table, new=new)
    columns = (source_columns(spark, name) if new is None else
               {f.name: f.dataType for f in new.schema if f.name not in METADATA_COLUMNS})
    return Prepared(described, sources, table,
                    RowShape(route, survey, rule.key, columns))


@dataclass(frozen=True)
class TableSpec:
    """What a new table of the replica is made from: its route, its key rule, its
    source tables and the opt-in Delta features of `lakehouse.table_features`."""

    route: ReplicaRoute
    rule: KeyRule
    sources: Sources
    features: list[str]


def _create_or_evolve(spark: SparkSession, change: SchemaChange, spec: TableSpec, *,
                      survey: Survey, table: ReplicaTable) -> NewTable | None:
    """Each table the apply writes created or evolved for `change`; a new replica is
    returned, to be created with its first rows."""
    route, name = spec.route, table.name
    targets = [name]
    if route.history and not spec.rule.append:
        targets.append(history_name(name[0], route.replica))
    new = None
    for target in targets:
        if target == name and not table.exists:
            new = new_table(target, change, spec, history=False)
            if survey.truncates or (spec.sources.dropped and route.on_drop == "truncate"):
                # Set with the first rows, as on an existing replica before its first
                # marker lands (`merge.above_truncates`).
                new = replace(new, properties={**new.properties, TRUNCATED_PROPERTY: "true"})
        elif not table_exists(spark, *target):
            created = new_table(target, change, spec, history=target != name)
            create_table(spark, target, created.schema, created.properties)
        elif change:
            mapped = "delta.columnMapping.mode" in table_detail(spark, *target)["properties"]
            if change.add and not mapped:
                check_unmapped_names([f.name for f in change.add], ".".join(target))
            apply_changes(spark, target, change)
    return new


def new_table(target: tuple[str, str], change: SchemaChange, spec: TableSpec, *,
              history: bool) -> NewTable:
    """The schema and properties of a new replica (or history) table."""
    from binlog_assets.lakehouse.history import HISTORY_METADATA

    route, rule, sources, features = spec.route, spec.rule, spec.sources, spec.features
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
    if "column_mapping" not in features:
        check_unmapped_names([f.name for f in schema], ".".join(target))
    return NewTable(target, schema, {**properties, **feature_properties(features)})
