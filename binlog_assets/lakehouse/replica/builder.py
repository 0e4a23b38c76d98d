"""Silver replicas: `ReplicaBuilder.apply` makes each replica table equal its source
tables as of the last applied position, one Delta commit per apply.

An apply finds the replica's tables (`tables.py`), plans the batch (`batch.py`), makes
the tables ready for its columns (`tables.py`), and writes it the Arrow way
(`arrow_write.py`) or Spark's (`spark_write.py`). How an apply reads, reduces, types and
writes a batch, and the replica table's columns: docs/architecture.md, "A replica apply".
"""

from __future__ import annotations

import threading
from contextlib import suppress
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from binlog_assets.config import PipelineConfig
from binlog_assets.identifiers import qualified
from binlog_assets.lakehouse.changelog_reader import (
    LazyRange,
    changelog_version,
    read_changelog,
    register_changelog,
)
from binlog_assets.lakehouse.delta_log import (
    TableCreatedMeanwhile,
    forget,
    known_views,
    log_scope,
    share_lookups,
    txn_version,
)
from binlog_assets.lakehouse.replica.arrow_apply import NeedsSpark, arrow_applies
from binlog_assets.lakehouse.replica.arrow_write import write_arrow
from binlog_assets.lakehouse.replica.batch import plan_batch
from binlog_assets.lakehouse.replica.cutover import record_cutovers
from binlog_assets.lakehouse.replica.loads import loading, without_loads
from binlog_assets.lakehouse.replica.plan import (
    APPEND_ONLY,
    ReplicaError,
    ReplicaResult,
    Stamp,
    Versions,
    applied_result,
    fallback_warning,
)
from binlog_assets.lakehouse.replica.routes import ReplicaRoute, replica_route
from binlog_assets.lakehouse.replica.spark_write import append_rows, merge_keyed
from binlog_assets.lakehouse.replica.tables import (
    advance_empty,
    ensure_view,
    find_table,
    history_name,
    prepare_tables,
    view_name,
)
from binlog_assets.lakehouse.spark import Evaluation, new_session
from binlog_assets.lakehouse.transactions import APP_ID

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["APPEND_ONLY", "ReplicaBuilder", "ReplicaError", "ReplicaResult"]


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
        return view_name(self.database, replica)

    def history_name(self, replica: str) -> tuple[str, str]:
        return history_name(self.database, replica)

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

    # -- one apply: find, plan, prepare, write ---------------------------------------

    def _apply(self, route: ReplicaRoute, up_to_version: int | None) -> ReplicaResult:
        spark = self.spark
        pipeline = self.pipeline
        up_to = changelog_version(spark, pipeline) if up_to_version is None else up_to_version
        found = find_table(spark, self.database, route)
        applied, stored_rule = found.applied, found.stored_rule
        behind = [t for t, version in applied.items() if version is None or version < up_to]
        if up_to < 0 or not behind:
            done = applied[found.table.name]
            return ReplicaResult(route.replica, applied_version=-1 if done is None else done,
                                 skipped=True, key_rule=stored_rule,
                                 warning=fallback_warning(route, stored_rule))
        held = loading(found.table.props)
        if held:  # a load appends to it: its changes wait for the load's end
            done = applied[found.table.name]
            return ReplicaResult(route.replica, applied_version=-1 if done is None else done,
                                 skipped=True, key_rule=stored_rule, held=True,
                                 warning=f"replica {route.replica}: held by its load "
                                         f"({', '.join(held)})")
        starts = [applied[t] for t in behind]
        versions = Versions(None if None in starts else min(starts), up_to, behind)

        # Read by Spark only when the batch needs it: an Arrow apply reads it so.
        props = found.table.props
        batch = LazyRange(lambda: without_loads(
            read_changelog(spark, pipeline, versions.start, up_to), props))
        plan = plan_batch(spark, pipeline, batch, found=found, versions=versions,
                          evaluation=self._evaluation)
        rule, survey = plan.rule, plan.survey
        if rule is None or (not survey.rows and not found.table.props):
            return advance_empty(spark, pipeline, route, stored_rule, versions=versions)

        now = datetime.now(UTC)
        prepared = prepare_tables(spark, pipeline, route, plan, table=found.table)
        table = replace(prepared.table, new=record_cutovers(
            spark, found.table.name, found.table.props, plan.cutovers, prepared.table.new))
        prepared = replace(prepared, table=table)
        shape, changes = prepared.shape, prepared.changes
        counts = None
        if arrow_applies(rule, shape=shape, table=table, sources=prepared.sources,
                         cutovers=plan.cutovers, limit=pipeline.lakehouse.arrow_commit_rows):
            with suppress(NeedsSpark):  # else Spark's way below, for the whole batch
                counts = write_arrow(spark, pipeline, rule, shape=shape, table=table,
                                     versions=versions)
        if counts is None and rule.append:
            counts = {"written": append_rows(spark, batch.frame(), Stamp(up_to, now),
                                             shape=shape, table=table)}
        elif counts is None:
            changes = changes + [c.describe() for c in plan.cutovers]
            counts = merge_keyed(spark, pipeline, plan, prepared, versions=versions, now=now)
        if table.new is not None and not rule.append:
            ensure_view(spark, table.name, create=True)
        return applied_result(route, survey, up_to, rule, changes, **counts)
