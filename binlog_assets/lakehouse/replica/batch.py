"""What a batch of changelog versions holds for one replica (`plan_batch`): its survey,
its DDL, the cut-overs of tables renamed into the replica, and the key rule it is
applied by (None: no table routed here, as after a dropped database or a table renamed
away)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from binlog_assets.lakehouse.changelog_reader import read_changelog
from binlog_assets.lakehouse.ddl import DdlPlan
from binlog_assets.lakehouse.replica.cutover import CUTOVERS_PROPERTY, Cutover, plan_cutovers
from binlog_assets.lakehouse.replica.ddl_apply import note_adds, read_ddl
from binlog_assets.lakehouse.replica.loads import recorded_loads
from binlog_assets.lakehouse.replica.plan import (
    APPEND_ONLY,
    Found,
    KeyRule,
    Survey,
    Versions,
    key_rule,
    survey_batch,
)
from binlog_assets.lakehouse.spark import INTERPRET_ROWS, Evaluation

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from binlog_assets.config import PipelineConfig
    from binlog_assets.lakehouse.changelog_reader import LazyRange


@dataclass(frozen=True)
class BatchPlan:
    """The batch (read by Spark on first use) and what it holds for the replica."""

    batch: LazyRange
    survey: Survey
    ddl: DdlPlan
    cutovers: list[Cutover]
    rule: KeyRule | None


def plan_batch(spark: SparkSession, pipeline: PipelineConfig, batch: LazyRange, *,
               found: Found, versions: Versions, evaluation: Evaluation) -> BatchPlan:
    """What the batch holds for `found`'s replica; see the module docstring."""
    route = found.route
    start, up_to = versions.start, versions.up_to
    survey = survey_batch(spark, pipeline, batch.frame, route, start, up_to,
                          sorted(recorded_loads(found.table.props)))
    # A small batch in one partition: its reduce then needs no shuffle (a stage and a
    # job of its own, most of a small apply's Spark time).
    batch.single = survey.rows <= pipeline.lakehouse.arrow_commit_rows
    evaluation.interpret(survey.rows <= INTERPRET_ROWS)
    # A new replica (a first build, a rebuild) follows the DDL too: it is built as its
    # source tables are at the batch's end.
    ddl = read_ddl(batch.frame(), route) if survey.ddl else DdlPlan()
    note_adds(survey, ddl)
    props = found.table.props
    cutovers = []
    # An append-only replica is the log of its tables' changes: a swap adds none.
    if ((ddl.table_renames or CUTOVERS_PROPERTY in props)
            and found.stored_rule != APPEND_ONLY):
        # The swaps' tables, types and keys join the survey before the key rule is read.
        cutovers = plan_cutovers(
            ddl, route, survey, batch=batch.frame(), props=props,
            changelog=lambda: read_changelog(spark, pipeline, None, up_to))
    rule = key_rule(route, survey, props) if survey.tables or ddl else None
    return BatchPlan(batch, survey, ddl, cutovers, rule)
