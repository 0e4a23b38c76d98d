"""Renames and drops in a replica: what a batch's DDL asks (`lakehouse/ddl.py`), done in
Spark, from the columns the replica records per source table (`binlake.source_columns`)
and the table's `schema_evolution` and `on_drop`.

The rules: docs/architecture.md, "Renames and drops".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql import types as T

from binlog_assets.formats.event import DATABASE_WIDE, OP_DDL, OP_TRUNCATE
from binlog_assets.identifiers import qualified, quote
from binlog_assets.lakehouse.columns import (
    binlog_before_sql,
    changelog_position,
    key_match,
    position_literal,
    position_sql,
    split_table,
)
from binlog_assets.lakehouse.ddl import DdlEvent, DdlPlan, plan_ddl
from binlog_assets.lakehouse.delta_log import (
    merge_aliases,
    set_properties,
    sql_string,
    table_detail,
)
from binlog_assets.lakehouse.replica.plan import ReplicaTable, RowShape, Survey
from binlog_assets.lakehouse.replica.routes import SOURCE_KEY_COLUMNS, ReplicaRoute
from binlog_assets.lakehouse.schema import SchemaEvolutionError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SOURCES_PROPERTY = "binlake.source_columns"
# table -> (position of its latest definition, its lower-case columns; None: not known)
Known = dict[str, tuple[tuple[int, ...], list[str] | None]]


def read_ddl(batch: DataFrame, route: ReplicaRoute) -> DdlPlan:
    """The batch's DDL events (few: one small job) planned for the replica."""
    rows = (batch.where(F.col("op") == OP_DDL)
            .select("table", changelog_position().alias("_p"), "ddl", "column_types",
                    "source_ts").collect())
    return plan_ddl([DdlEvent.from_row(r["table"], tuple(r["_p"]), r["ddl"],
                                       r["column_types"], r["source_ts"]) for r in rows],
                    route.matches)


@dataclass
class Sources:
    """The replica's record of its source tables, before and after this batch."""

    stored: Known
    known: Known
    # (db.table, position) of each table drop the replica acts on, in binlog order
    dropped: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Tables the batch's renames and drops took out of the record.
    gone: set[str] = field(default_factory=set)

    @property
    def changed(self) -> bool:
        return self.known != self.stored

    def property_value(self) -> str:
        return json.dumps({t: [list(p), c] for t, (p, c) in sorted(self.known.items())},
                          separators=(",", ":"))

    def columns(self, tables: list[str]) -> set[str] | None:
        """Every column some source table has (lower-case); None while one of them, or
        one of `tables` (the batch's) that is still there, is unknown (a format that
        declares no types)."""
        if not self.known or any(t not in self.known and t not in self.gone for t in tables):
            return None
        out: set[str] = set()
        for _, cols in self.known.values():
            if cols is None:
                return None
            out.update(cols)
        return out


def track_sources(props: dict[str, str], survey: Survey, plan: DdlPlan,
                  route: ReplicaRoute, seed: list[str]) -> Sources:
    """The record updated by the batch: definitions newer than the stored ones win, and
    renamed and dropped tables leave it. `seed` are the tables an existing replica held
    before it kept a record (their columns unknown until their next definition)."""
    raw = json.loads(props[SOURCES_PROPERTY]) if SOURCES_PROPERTY in props else {
        t: [[], None] for t in seed}
    stored: Known = {t: (tuple(p), c) for t, (p, c) in raw.items()}
    known = dict(stored)
    for table, (pos, cols) in [*survey.table_columns.items(), *plan.definitions.items()]:
        # The position moves only with the columns: the record is a table property,
        # written (a commit) only when a table's columns change.
        if table not in known or (pos >= known[table][0] and cols != known[table][1]):
            known[table] = (pos, cols)
    sources = Sources(stored, known)
    # Renames and drops in binlog order: a table renamed within the replica and then
    # dropped with its database is dropped under its new name.
    steps = sorted([*((p, "drop", t, None) for t, p in plan.drops.items()),
                    *((p, "rename", old, new) for old, new, p in plan.table_renames)],
                   key=lambda s: s[0])
    for pos, kind, name, new in steps:
        if kind == "rename" and route.matches(name) and route.matches(new):
            # The rows move with `move_table_rows`; a definition newer than the rename
            # is of a table created again under the old name, which stays.
            if name in known and known[name][0] < pos:
                entry = known.pop(name)
                known.setdefault(new, entry)
                sources.gone.add(name)
            continue
        if kind == "rename" and not route.matches(name):
            sources.notes.append(
                f"table {name} renamed to {new}: its rows from before the rename are not "
                f"in the replica (re-snapshot {new} to bring them)")
            continue
        db, table = split_table(name)
        targets = (sorted(t for t in known if split_table(t)[0] == db)
                   if table == DATABASE_WIDE else [name])
        for target in targets:
            # A table created again after the drop keeps its new definition; its rows
            # from before the drop go all the same (the drop's marker is below the new).
            if not (target in known and known[target][0] > pos):
                known.pop(target, None)
                sources.gone.add(target)
            sources.dropped.append((target, pos))
            if new is not None:
                sources.notes.append(f"table {target} renamed to {new}, which feeds no "
                                     "table config of this replica")
    for table, clause, _ in plan.partition_rows:
        sources.notes.append(
            f"{clause} on {table}: the source's rows of the partition changed with no row "
            f"events in the binlog, so the replica still holds them as they were "
            f"(re-snapshot {table} to bring it level)")
    return sources


def drop_stale(survey: Survey, sources: Sources) -> None:
    """Leave out of the batch's declared types the columns no source table has now:
    they come from images older than a drop or rename."""
    have = sources.columns(survey.tables)
    if have is None:
        return
    for types in (survey.declared, survey.inferred):
        for column in [c for c in types if c.lower() not in have]:
            del types[column]


def replica_sources(spark: SparkSession, survey: Survey, plan: DdlPlan, route: ReplicaRoute,
                    *, table: ReplicaTable) -> Sources:
    """The record as the batch leaves it (`track_sources`). An existing replica without
    one is seeded with the tables it holds rows of, and the batch's declared types lose
    the columns no source table has now (`drop_stale`)."""
    props = table.props
    seed = (held_tables(spark, table.name) if table.exists and not props.get(SOURCES_PROPERTY)
            else [])
    sources = track_sources(props, survey, plan, route, seed)
    if table.exists:
        drop_stale(survey, sources)
    return sources


def held_tables(spark: SparkSession, table: tuple[str, str]) -> list[str]:
    """The source tables an existing replica holds rows of (one job, once: replicas
    record their source tables from then on)."""
    rows = (spark.table(qualified(*table)).select("_source_db", "_source_table")
            .distinct().collect())
    return [f"{r[0]}.{r[1]}" for r in rows if r[0] is not None and r[1] is not None]


def record_sources(spark: SparkSession, table: tuple[str, str], props: dict[str, str],
                   sources: Sources) -> None:
    """Store the record on an existing replica when the batch changed it or the replica
    has none yet (a commit, so only then)."""
    if sources.changed or SOURCES_PROPERTY not in props:
        set_properties(spark, table, {SOURCES_PROPERTY: sources.property_value()})


@dataclass
class ColumnPlan:
    """Column renames and drops for the replica table, as replica column names."""

    # (db.table, [(name, position of its rename), ...] oldest first, final name)
    renames: list[tuple[str, list[tuple[str, tuple[int, ...]]], str]] = field(
        default_factory=list)
    drops: list[str] = field(default_factory=list)

    def describe(self) -> list[str]:
        return ([f"rename column {a} -> {b} ({table})" for table, steps, final in self.renames
                 for (a, _), b in zip(steps, [*(n for n, _ in steps[1:]), final],
                                      strict=True)]
                + [f"drop column {c}" for c in self.drops])


def plan_columns(current: dict[str, T.DataType], plan: DdlPlan, sources: Sources,
                 survey: Survey, key: list[str], route: ReplicaRoute) -> ColumnPlan:
    """What the batch's renames and drops ask of the replica's `current` columns, under
    the replica's `schema_evolution`. Renames of one column in a row chain (a -> b -> c)
    are one move: a row holds its value under the name it had at its position."""
    by_lower = {c.lower(): c for c in current}
    chains: dict[tuple[str, str], tuple[list[tuple[str, tuple[int, ...]]], str]] = {}
    for table, old, new, pos in plan.column_renames:
        steps, _ = chains.pop((table, old.lower()), ([], old))
        chains[(table, new.lower())] = ([*steps, (old, pos)], new)
    out = ColumnPlan()
    for (table, final), (steps, _) in chains.items():
        if final in by_lower and any(n.lower() in by_lower for n, _ in steps):
            out.renames.append((table, [(by_lower.get(n.lower(), n), p) for n, p in steps],
                                by_lower[final]))
    have = sources.columns(survey.tables)
    if have is not None and (plan.definitions or plan.column_renames):
        keep = {k.lower() for k in key}
        out.drops = [c for c in current if c.lower() not in have and c.lower() not in keep
                     and c not in SOURCE_KEY_COLUMNS]
    if route.schema_evolution == "exception" and (out.renames or out.drops):
        raise SchemaEvolutionError(
            f"replica {route.replica!r} has schema_evolution: exception and the source "
            f"changed: {'; '.join(out.describe())}")
    if route.schema_evolution == "ignore":
        return ColumnPlan()
    for _, steps, final in out.renames:
        survey.aliases.setdefault(final.lower(), []).extend(n for n, _ in reversed(steps))
    return out


def shape_new_table(plan: DdlPlan, sources: Sources, survey: Survey, key: list[str],
                    route: ReplicaRoute) -> list[str]:
    """A new replica built from a batch with DDL, under `evolve`, takes the columns its
    source tables have now: renamed columns under their last name (older images read
    under the former ones), dropped ones left out. Descriptions of what it did, and the
    notes of what it could not do."""
    if route.schema_evolution != "evolve":
        return sources.notes  # a new table takes every column of the batch
    columns = plan_columns({**survey.inferred, **survey.declared}, plan, sources, survey,
                           key, route)
    drop_stale(survey, sources)
    return columns.describe() + sources.notes


def note_adds(survey: Survey, plan: DdlPlan) -> None:
    """The batch's column ADDs whose default the replica can give its older rows, into
    `survey.added` for `typed_columns(live=True)` (the batch's images)."""
    for (table, column), (position, add) in plan.column_adds.items():
        if add.known:
            survey.added.setdefault(column, []).append((table, position, add.default))


def set_added_defaults(spark: SparkSession, table: tuple[str, str],
                       current: dict[str, T.DataType], plan: DdlPlan,
                       sources: Sources) -> list[str]:
    """Give each column a batch ADDs its default in the replica's rows of that table
    older than the ADD (before the MERGE, idempotent); descriptions of what it did."""
    by_lower = {c.lower(): c for c in current}
    described = []
    for (source, column), (position, add) in plan.column_adds.items():
        name = by_lower.get(column)
        if name is None:
            continue
        if not add.known:
            described.append(f"add column {name} ({source}): its default is an expression, "
                             f"older rows keep what they held")
            continue
        held = sources.stored.get(source, ((), None))[1]
        if add.default is None and held is not None and column not in held:
            continue  # new to the table: its older rows hold NULL already
        value = add.default if add.default is not None else "NULL"
        spark.sql(f"UPDATE {qualified(*table)} SET {quote(name)} = CAST({value} AS "
                  f"{current[name].simpleString()}) WHERE {_of_table(source)} AND "
                  f"{binlog_before_sql(position)}")
        described.append(f"add column {name} ({source}): older rows hold "
                         f"{'NULL' if add.default is None else add.default}")
    return described


def apply_ddl(spark: SparkSession, table: tuple[str, str], plan: DdlPlan, sources: Sources,
              *, shape: RowShape) -> tuple[list[str], bool]:
    """The batch's renames and drops in the replica `table`, whose key and source columns
    are `shape.columns`; (descriptions, whether columns changed)."""
    current, route, key = shape.columns, shape.route, shape.key
    columns = plan_columns(current, plan, sources, shape.survey, key, route)
    described = columns.describe()
    if columns.renames:
        move_renamed_values(spark, table, columns.renames, current)
    if columns.drops:
        mapped = "delta.columnMapping.mode" in table_detail(spark, *table)["properties"]
        drop_columns(spark, table, columns.drops, mapped=mapped)
    described += move_table_rows(spark, table, plan, route, key)
    described += set_added_defaults(spark, table, current, plan, sources)
    verb = "its rows leave the replica" if route.on_drop == "truncate" else "rows kept"
    described += [f"drop table {t}: {verb}" for t, _ in sources.dropped]
    described += sources.notes
    return described, bool(columns.renames or columns.drops)


def _of_table(source: str) -> str:
    db, name = split_table(source)
    return f"_source_db = {sql_string(db)} AND _source_table = {sql_string(name)}"


def move_renamed_values(spark: SparkSession, table: tuple[str, str],
                        renames: list, types: dict[str, T.DataType]) -> None:
    """Each renamed column's values for its table's rows older than the last rename: a
    row holds its value under the name the column had at the row's position."""
    for source, steps, final in renames:
        cases = " ".join(
            f"WHEN _position <= {position_sql(pos)} THEN "
            + (f"CAST({quote(old)} AS {types[final].simpleString()})" if old in types
               else "NULL")
            for old, pos in steps)
        spark.sql(f"UPDATE {qualified(*table)} SET {quote(final)} = CASE {cases} ELSE "
                  f"{quote(final)} END WHERE {_of_table(source)} AND "
                  f"_position <= {position_sql(steps[-1][1])}")


def drop_columns(spark: SparkSession, table: tuple[str, str], columns: list[str], *,
                 mapped: bool) -> None:
    """Drop `columns`: metadata-only with column mapping, else one rewrite of the table
    (Delta drops a column in place only where names are mapped)."""
    name = qualified(*table)
    if mapped:
        spark.sql(f"ALTER TABLE {name} DROP COLUMNS ({', '.join(quote(c) for c in columns)})")
        return
    df = spark.table(name)
    (df.select([quote(c) for c in df.columns if c not in columns])
     .write.format("delta").mode("overwrite").option("overwriteSchema", "true")
     .saveAsTable(name))


def move_table_rows(spark: SparkSession, table: tuple[str, str], plan: DdlPlan,
                    route: ReplicaRoute, key: list[str]) -> list[str]:
    """Rows of a renamed table become rows of its new name, where both feed the replica
    (a key the new name already holds keeps that newer row)."""
    described = []
    for old, new, _ in plan.table_renames:
        if not (route.matches(old) and route.matches(new)):
            continue
        (old_db, old_table), (new_db, new_table) = split_table(old), split_table(new)
        if route.sharded:
            t, s = merge_aliases(table)
            newer = (spark.table(qualified(*table))
                     .where((F.col("_source_db") == new_db)
                            & (F.col("_source_table") == new_table))
                     .select(*[quote(k) for k in key if k not in SOURCE_KEY_COLUMNS]))
            source_key = [k for k in key if k not in SOURCE_KEY_COLUMNS]
            (newer.alias(s).mergeInto(qualified(*table),
                                      key_match(source_key, t, s)
                                      & (F.col(f"{t}._source_db") == old_db)
                                      & (F.col(f"{t}._source_table") == old_table))
             .whenMatched().delete().merge())
        spark.sql(f"UPDATE {qualified(*table)} SET _source_db = {sql_string(new_db)}, "
                  f"_source_table = {sql_string(new_table)} WHERE {_of_table(old)}")
        described.append(f"move rows {old} -> {new}")
    return described


def move_batch_rows(batch: DataFrame, plan: DdlPlan, route: ReplicaRoute,
                    survey: Survey) -> DataFrame:
    """The batch with the changes of a table renamed within the replica that are older
    than the rename named as the new table, as `move_table_rows` does for the stored rows
    (in binlog order, so a chain of renames ends at the last name); the survey's
    tables, truncates and ADD defaults follow them."""
    moves = sorted(((p, old, new) for old, new, p in plan.table_renames
                    if route.matches(old) and route.matches(new)), key=lambda m: m[0])
    if not moves:
        return batch
    table = F.col("table")
    for position, old, new in moves:
        table = F.when((table == old) & (changelog_position() < position_literal(position)),
                       F.lit(new)).otherwise(table)
        if old in survey.tables and new not in survey.tables:
            survey.tables = sorted([*survey.tables, new])
        moved = survey.truncates.get(old)
        if moved is not None and moved < position:
            del survey.truncates[old]
            kept = survey.truncates.get(new)
            survey.truncates[new] = moved if kept is None else max(kept, moved)
        for adds in survey.added.values():
            adds[:] = [(new if t == old and p < position else t, p, d) for t, p, d in adds]
    return batch.withColumn("table", table)


def drop_markers(spark: SparkSession, rows: DataFrame, sources: Sources,
                 survey: Survey) -> DataFrame:
    """`rows` with a truncate marker for each dropped table (`on_drop: truncate`), and the
    survey's truncates moved up to the drops."""
    return truncate_markers(spark, rows, sources.dropped, survey)


def truncate_markers(spark: SparkSession, rows: DataFrame,
                     marks: list[tuple[str, tuple[int, ...]]], survey: Survey) -> DataFrame:
    """`rows` with a truncate marker for each (db.table, position) of `marks`, and the
    survey's truncates moved up to them."""
    if not marks:
        return rows
    markers = []
    for table, pos in marks:
        current = survey.truncates.get(table)
        survey.truncates[table] = pos if current is None else max(current, pos)
        db, name = split_table(table)
        values = {"_source_db": db, "_source_table": name, "_position": pos,
                  "_op": OP_TRUNCATE}
        markers.append(tuple(values.get(f.name) for f in rows.schema))
    survey.rows += len(markers)
    return rows.unionByName(spark.createDataFrame(markers, rows.schema))
