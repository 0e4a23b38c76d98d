"""Replica assets: one per configured replica table, built by Spark from the changelog.

A multi-asset with one spec per replica name in the config (`replica/<name>`), all
downstream of the changelog and subsettable, so the UI can build one replica or all.
Each apply reads the changelog versions the replica has not applied yet; the run config
`rebuild: true` drops the replica and applies the whole changelog again. Replicas follow
new changelog data on their own (eager automation, or a follower run: see
`replica_follower.py`), and dbt follows them.

Each replica carries the asset check `row_count_matches_changelog`, evaluated in the same
step right after the apply (the Spark session is already up): the rows in
`<replica>_current` against the live keys counted independently from the changelog by
delta-rs (`lakehouse.audit_arrow`, the same reduction as Spark's `lakehouse.audit`) at
the applied changelog version; for an append-only replica, its rows against the
distinct changes there.

The metadata says by which rule the replica is keyed (`key_rule`: `primary_key`,
`key_columns` or `append_only`) and, for a table whose changes carry no key and whose
config says nothing, a `warning` naming the settings that choose a rule.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

from binlog_assets.config import PipelineConfig
from binlog_assets.orchestration.partitions import CHANGELOG_ASSET_KEY
from binlog_assets.orchestration.replica_reports import (
    ROW_COUNT_CHECK,
    SOURCE_DELAY_CHECK,
    counted_rows,
    failure_line,
    replica_key,
    replica_metadata,
    replica_names,
    replica_table_metadata,
    replicas_failed,
    row_count_check,
    source_delay_check,
)
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import ASSET_GROUP, FOLLOW_UPSTREAM, SPARK_POOL
from binlog_assets.orchestration.table_metadata import replica_definition_metadata

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor


class ReplicaRunConfig(dg.Config):
    rebuild: bool = Field(False, description="drop the replicas and rebuild them from the "
                                             "whole changelog")


def _replica_specs(pipeline: PipelineConfig) -> list[dg.AssetSpec]:
    """An asset spec per replica, downstream of the changelog."""
    sources = {name: sorted(t.source for s in pipeline.sources for t in s.tables
                            if t.replica == name) for name in replica_names(pipeline)}
    return [
        dg.AssetSpec(
            replica_key(name),
            deps=[CHANGELOG_ASSET_KEY],
            group_name=ASSET_GROUP,
            kinds={"spark", "delta"},
            description=(f"Replica `{pipeline.lakehouse.database}.{name}` of source table(s) "
                         f"{', '.join(sources[name])}: equal to the source as of the last "
                         f"applied binlog position; live rows in `{name}_current`."),
            # A follower run (replica_follower.py) applies changes as they land instead.
            automation_condition=(None if pipeline.dagster.replica_follow_seconds
                                  else FOLLOW_UPSTREAM),
            metadata=replica_definition_metadata(pipeline, name),
        )
        for name in replica_names(pipeline)
    ]


def _check_specs(pipeline: PipelineConfig) -> list[dg.AssetCheckSpec]:
    """The asset checks each replica's build evaluates."""
    return [spec for name in replica_names(pipeline) for spec in (
        dg.AssetCheckSpec(ROW_COUNT_CHECK, asset=replica_key(name),
                          description="rows in the replica's `_current` view equal the "
                                      "live keys counted from the changelog"),
        dg.AssetCheckSpec(SOURCE_DELAY_CHECK, asset=replica_key(name),
                          description="the newest change applied reached the replica within "
                                      "dagster.replica_delay_alert_seconds of its source "
                                      "commit"))]


def build_replica_assets(pipeline: PipelineConfig) -> dg.AssetsDefinition:
    @dg.multi_asset(specs=_replica_specs(pipeline), check_specs=_check_specs(pipeline),
                    can_subset=True, pool=SPARK_POOL, name="replicas")
    def replicas(context: dg.AssetExecutionContext, config: ReplicaRunConfig,  # noqa: ANN202
                 binlake: BinlakeResource):  # Dagster would take a return annotation for outputs
        from concurrent.futures import ThreadPoolExecutor

        from binlog_assets.lakehouse.replica.builder import APPEND_ONLY, ReplicaBuilder

        spark, pipeline = binlake.spark(), binlake.pipeline
        selected = sorted(context.selected_asset_keys, key=lambda k: k.path)
        checked = context.selected_asset_check_keys
        builder_of: dict[dg.AssetKey, ReplicaBuilder] = {}

        def build(key: dg.AssetKey) -> tuple:
            # A builder (a Spark session) per replica: their applies overlap, one's Spark
            # jobs running while another's driver plans, commits or talks to the catalog.
            began = time.monotonic()
            builder = ReplicaBuilder(spark, pipeline)
            name = key.path[-1]
            builder_of[key] = builder
            result = builder.rebuild(name) if config.rebuild else builder.apply(name)
            applied = time.monotonic()
            delay = (source_delay_check(key, result,
                                        pipeline.dagster.replica_delay_alert_seconds,
                                        time.time())
                     if dg.AssetCheckKey(key, SOURCE_DELAY_CHECK) in checked else None)
            live = counted_rows(builder, name, result.key_rule)
            check = (row_count_check(builder, name, result.key_rule, live,
                                     result.applied_version)
                     if dg.AssetCheckKey(key, ROW_COUNT_CHECK) in checked else None)
            seconds = (applied - began, time.monotonic() - applied)
            return result, live, [c for c in (check, delay) if c is not None], seconds

        workers = max(1, min(len(selected), pipeline.spark.parallel_replicas))
        with ThreadPoolExecutor(workers, thread_name_prefix="replica") as pool, \
                _cancelled_on_interrupt(pool, builder_of):
            failed: list[tuple[str, Exception]] = []
            for key, future in [(key, pool.submit(build, key)) for key in selected]:
                try:
                    result, live, checks, (apply_s, count_s) = future.result()
                except Exception as exc:  # the others are still applied and reported
                    failed.append((key.path[-1], exc))
                    context.log.error(f"replica {key.path[-1]}: {type(exc).__name__}: "
                                      f"{failure_line(exc)}")
                    continue
                append = result.key_rule == APPEND_ONLY
                context.log.info(f"replica {key.path[-1]}: {live} "
                                 f"{'changes' if append else 'live rows'}; applied in "
                                 f"{apply_s:.1f}s, counted and checked in {count_s:.1f}s; "
                                 f"{result}")
                if result.warning:
                    context.log.warning(result.warning)
                md = replica_metadata(result, live) | replica_table_metadata(builder_of[key],
                                                                           key.path[-1])
                md["apply_seconds"] = dg.MetadataValue.float(round(apply_s, 3))
                yield dg.MaterializeResult(asset_key=key, metadata=md)
                yield from checks
        if failed:
            raise replicas_failed(failed, len(selected))

    return replicas


@contextmanager
def _cancelled_on_interrupt(pool: "ThreadPoolExecutor", builders: dict) -> Iterator[None]:
    """On an interrupt (Dagster terminating the run), no replica starts after it and the
    applies in progress have their Spark jobs cancelled: each apply is one Delta commit,
    so a replica is then applied or as it was, and the next build goes on from there.
    Without this the pool's exit waited for every replica still to build."""
    try:
        yield
    except Exception:
        raise
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        for builder in list(builders.values()):
            builder.spark.interruptAll()
        raise
