"""Tables renamed into a replica from outside it: the cut-over of an online schema change
(pt-online-schema-change, gh-ost), each recorded in `binlake.cutovers` and done again
when a late change of the helper arrives.

The rules: docs/architecture.md, "Cut-overs of online schema changes".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from binlog_assets.formats.event import OP_DDL
from binlog_assets.identifiers import col
from binlog_assets.lakehouse.changelog_reader import survey_of_frame
from binlog_assets.lakehouse.columns import changelog_position, first_per_group, position_literal
from binlog_assets.lakehouse.ddl import starts_table
from binlog_assets.lakehouse.delta_log import NewTable, set_properties
from binlog_assets.lakehouse.replica.ddl_apply import truncate_markers
from binlog_assets.lakehouse.replica.plan import ROW_OPS, Survey, add_groups
from binlog_assets.lakehouse.replica.rows import keyed_rows
from binlog_assets.lakehouse.schema import widen_all

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession

    from binlog_assets.lakehouse.ddl import DdlPlan
    from binlog_assets.lakehouse.replica.plan import RowShape
    from binlog_assets.lakehouse.replica.routes import ReplicaRoute

# The brought rows' `row_index`: above every event of the rename's own record, and the
# rename's binlog position is below any later change of the table.
PLACED_ROW_INDEX = 2**31 - 1
CUTOVERS_PROPERTY = "binlake.cutovers"  # helper -> [target, rename position, generation]


@dataclass
class Cutover:
    """A table renamed into the replica, and its changes from before the rename."""

    old: str
    new: str
    position: tuple[int, ...]  # the rename's
    changes: DataFrame  # the helper's row changes below the rename, named as `new`
    count: int  # how many
    generation: int = 0  # how many times it was done before (late helper changes)

    @property
    def placed(self) -> tuple[int, ...]:
        """Where its rows go: just above the rename, above an earlier generation's."""
        return (*self.position[:4], self.position[4] + self.generation, PLACED_ROW_INDEX)

    def describe(self) -> str:
        again = (f", again for changes of {self.old} that arrived after it"
                 if self.generation else "")
        return (f"table {self.old} renamed to {self.new}: the replica's rows of {self.new} "
                f"are {self.old}'s as of the rename ({self.count} changes read{again})")


def recorded_cutovers(props: dict[str, str]) -> dict[str, tuple[str, tuple[int, ...], int]]:
    """The cut-overs done on the replica: helper -> (target, rename position, generation)."""
    raw = json.loads(props.get(CUTOVERS_PROPERTY, "{}"))
    return {old: (new, tuple(position), generation)
            for old, (new, position, generation) in raw.items()}


def cutover_property(props: dict[str, str], cutovers: list[Cutover]) -> dict[str, str]:
    """The record with `cutovers` in it, to store before their rows are written (a redo
    after a crash in between takes a higher generation still)."""
    recorded = {old: [new, list(p), g] for old, (new, p, g) in recorded_cutovers(props).items()}
    for c in cutovers:
        recorded[c.old] = [c.new, list(c.position), c.generation]
    return {CUTOVERS_PROPERTY: json.dumps(recorded, separators=(",", ":"), sort_keys=True)}


def record_cutovers(spark: SparkSession, table: tuple[str, str], props: dict[str, str],
                    cutovers: list[Cutover], new: NewTable | None) -> NewTable | None:
    """Record `cutovers` on the replica before their rows are written: with a new
    table's first commit (`new`, returned with the property), else as a commit of its
    own."""
    if not cutovers:
        return new
    if new is not None:
        return replace(new, properties={**new.properties, **cutover_property(props, cutovers)})
    set_properties(spark, table, cutover_property(props, cutovers))
    return None


def plan_cutovers(plan: DdlPlan, route: ReplicaRoute, survey: Survey, *, batch: DataFrame,
                  props: dict[str, str], changelog: Callable[[], DataFrame]) -> list[Cutover]:
    """The swaps this apply does: the batch's renames into the replica from tables it
    does not take, whose changes `changelog()` (up to the batch's end, read only for a
    swap) holds, and recorded ones whose helper has changes from before its rename in
    the batch. Their tables, types and keys join `survey`; their renames, and renames of
    the target away at or before them, leave `plan` (they are the swap, done here), and
    the helper's definition becomes the target's."""
    renames: dict[tuple[str, str], tuple[int, ...]] = {}
    for old, new, position in plan.table_renames:
        if not route.matches(old) and route.matches(new):
            renames[(old, new)] = max(renames.get((old, new), position), position)
    recorded = recorded_cutovers(props)
    generations = {}
    for old, (new, position, generation) in recorded.items():
        if (old, new) not in renames and old in survey.others and not batch.where(
                (F.col("table") == old)
                & (changelog_position() < position_literal(position))).isEmpty():
            renames[(old, new)] = position
            generations[(old, new)] = generation + 1
    if not renames:
        return []
    frame = changelog()
    cutovers = []
    # Only the last swap of a helper counts: it replaces every row of the target below it.
    for (old, new), position in sorted(renames.items(), key=lambda r: r[1]):
        generation = generations.get((old, new), 0)
        if generation == 0 and old in recorded and recorded[old][1] == position:
            generation = recorded[old][2] + 1  # the same swap, applied again
        # The helper's rows from before an earlier rename of it away were another
        # incarnation's (a tool that runs again creates its helper again).
        aways = [p for o, _, p in plan.table_renames
                 if o == old and p[:4] < position[:4]]  # another statement's
        if old in recorded and recorded[old][1] < position:
            aways.append(recorded[old][1])
        cutover = _cutover(frame, (old, new, position), survey, plan, generation=generation,
                           floor=max(aways, default=None))
        if cutover is not None:
            cutovers.append(cutover)
    # Renames of a target away at or before its swap are the swap's other half: without
    # the helper's changes the target keeps its rows rather than lose them all.
    targets: dict[str, tuple[int, ...]] = {}
    for (_, new), position in renames.items():
        targets[new] = max(targets.get(new, position), position)
    done = {(c.old, c.new) for c in cutovers}
    plan.table_renames = [
        (old, new, p) for old, new, p in plan.table_renames
        if (old, new) not in done and not (old in targets and p <= targets[old])]
    return cutovers


def _cutover(changelog: DataFrame, rename: tuple[str, str, tuple[int, ...]], survey: Survey,
             plan: DdlPlan, *, generation: int, floor: tuple[int, ...] | None
             ) -> Cutover | None:
    """The swap of `rename` (`old` into `new` at `position`, as `DdlPlan.table_renames`
    holds it), from the helper's changes between its latest CREATE or DROP (or `floor`,
    its latest rename away) and the rename."""
    old, new, position = rename
    before = changelog.where((F.col("table") == old)
                             & (changelog_position() < position_literal(position)))
    starts = [tuple(r["_p"]) for r in before.where(F.col("op") == OP_DDL)
              .select(changelog_position().alias("_p"), "ddl").collect()
              if starts_table(r["ddl"] or "")]
    floor = max([*starts, *([floor] if floor else [])], default=None)
    if floor is not None:
        before = before.where(changelog_position() > position_literal(floor))
    # One small aggregate job: the helper's definitions, types, keys and truncates.
    groups = [g._replace(table=new) for g in survey_of_frame(before)]
    if not groups:
        return None  # not in the changelog: the notes say to re-snapshot
    part = Survey([new], 0, None, {}, {}, set(), {})
    add_groups(part, groups)
    changes = before.where(F.col("op").isin(*ROW_OPS))
    cleared = part.truncates.get(new)
    if cleared is not None:  # the helper's own truncate
        changes = changes.where(changelog_position() > position_literal(cleared))
    cutover = Cutover(old, new, position, changes.withColumn("table", F.lit(new)),
                      part.rows, generation)
    _join_survey(survey, part, cutover)
    if new in part.table_columns:
        defined = plan.definitions.get(new)
        if defined is None or defined[0] < cutover.placed:
            plan.definitions[new] = (cutover.placed, part.table_columns[new][1])
    return cutover


def _join_survey(survey: Survey, part: Survey, cutover: Cutover) -> None:
    new = cutover.new
    if new not in survey.tables:
        survey.tables = sorted([*survey.tables, new])
    survey.rows += part.rows
    survey.upserts += part.upserts
    survey.deletes += part.deletes
    survey.key_columns |= part.key_columns
    widen_all(survey.declared, part.declared)
    widen_all(survey.inferred, part.inferred)
    # Known before the table is made: a new replica records that it holds a marker.
    marked = survey.truncates.get(new)
    survey.truncates[new] = cutover.position if marked is None else max(marked,
                                                                         cutover.position)
    # Changes of the target from after the rename keep their own definition.
    latest = survey.table_columns.get(new)
    if new in part.table_columns and (latest is None or latest[0] < cutover.placed):
        survey.table_columns[new] = (cutover.placed, part.table_columns[new][1])


def cutover_rows(spark: SparkSession, rows: DataFrame, cutovers: list[Cutover], *,
                 shape: RowShape) -> DataFrame:
    """`rows` (the batch's keyed rows) with each cut-over's truncate marker at the
    rename and the helper's last change per key placed just above it."""
    for cutover in cutovers:
        keyed = keyed_rows(cutover.changes, shape=shape)
        last = (first_per_group(keyed, [col(k) for k in shape.key], [col("_position").desc()])
                .withColumn("_position", position_literal(cutover.placed)))
        rows = truncate_markers(spark, rows, [(cutover.new, cutover.position)], shape.survey)
        rows = rows.unionByName(last)
    return rows
