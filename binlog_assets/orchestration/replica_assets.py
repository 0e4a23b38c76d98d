"""Replica assets: one per configured replica table, built by Spark from the changelog.

A multi-asset with one spec per replica name in the config (`replica/<name>`), all
downstream of the changelog and subsettable, so the UI can build one replica or all.
Each apply reads the changelog versions the replica has not applied yet; the run config
`rebuild: true` drops the replica and applies the whole changelog again. Replicas follow
new changelog data on their own (eager automation, or a follower run: see
`replica_follower.py`), and dbt follows them.

Each replica carries the asset check `row_count_matches_changelog`, evaluated in the same
step right after the apply (the Spark session is already up): the rows in
`<replica>_current` against the live keys counted independently from the changelog
(`lakehouse.audit.expected_live_rows`) at the applied changelog version; for an
append-only replica, its rows against the distinct changes there
(`lakehouse.audit.expected_log_rows`).

The metadata says by which rule the replica is keyed (`key_rule`: `primary_key`,
`key_columns` or `append_only`) and, for a table whose changes carry no key and whose
config says nothing, a `warning` naming the settings that choose a rule.
"""

import time

import dagster as dg
from pydantic import Field

from binlog_assets.config import PipelineConfig
from binlog_assets.orchestration.partitions import CHANGELOG_ASSET_KEY
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import FOLLOW_UPSTREAM, SPARK_POOL


class ReplicaRunConfig(dg.Config):
    rebuild: bool = Field(False, description="drop the replicas and rebuild them from the "
                                             "whole changelog")


ROW_COUNT_CHECK = "row_count_matches_changelog"


def row_count_check_result(key: dg.AssetKey, live: int, expected: int,
                           version: int) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        asset_key=key, check_name=ROW_COUNT_CHECK, passed=live == expected,
        metadata={"replica_rows": dg.MetadataValue.int(live),
                  "changelog_live_keys": dg.MetadataValue.int(expected),
                  "changelog_version": dg.MetadataValue.int(version)},
        description=(f"{live} rows, as the changelog says at version {version}"
                     if live == expected else
                     f"{live} rows in the replica, but {expected} live keys in the changelog "
                     f"at version {version}"),
    )


def replica_key(name: str) -> dg.AssetKey:
    return dg.AssetKey(["replica", name])


def replica_names(config: PipelineConfig) -> list[str]:
    return sorted({t.replica for s in config.sources for t in s.tables})


def build_replica_assets(config: PipelineConfig) -> dg.AssetsDefinition:
    sources = {name: sorted(t.source for s in config.sources for t in s.tables
                            if t.replica == name) for name in replica_names(config)}
    specs = [
        dg.AssetSpec(
            replica_key(name),
            deps=[CHANGELOG_ASSET_KEY],
            group_name="binlake",
            kinds={"spark", "delta"},
            description=(f"Replica `{config.lakehouse.database}.{name}` of source table(s) "
                         f"{', '.join(sources[name])}: equal to the source as of the last "
                         f"applied binlog position; live rows in `{name}_current`."),
            # A follower run (replica_follower.py) applies changes as they land instead.
            automation_condition=(None if config.dagster.replica_follow_seconds
                                  else FOLLOW_UPSTREAM),
        )
        for name in replica_names(config)
    ]

    checks = [dg.AssetCheckSpec(ROW_COUNT_CHECK, asset=replica_key(name),
                                description="rows in the replica's `_current` view equal the "
                                            "live keys counted from the changelog")
              for name in replica_names(config)]

    @dg.multi_asset(specs=specs, check_specs=checks, can_subset=True, pool=SPARK_POOL,
                    name="replicas")
    def replicas(context: dg.AssetExecutionContext, config: ReplicaRunConfig,
                 binlake: BinlakeResource):
        from concurrent.futures import ThreadPoolExecutor

        from binlog_assets.lakehouse.replica import APPEND_ONLY, ReplicaBuilder

        spark, pipeline = binlake.spark(), binlake.pipeline
        selected = sorted(context.selected_asset_keys, key=lambda k: k.path)
        checked = context.selected_asset_check_keys

        def build(key: dg.AssetKey):
            # A builder (a Spark session) per replica: their applies overlap, one's Spark
            # jobs running while another's driver plans, commits or talks to the catalog.
            began = time.monotonic()
            builder = ReplicaBuilder(spark, pipeline)
            name = key.path[-1]
            result = builder.rebuild(name) if config.rebuild else builder.apply(name)
            applied = time.monotonic()
            live = counted_rows(builder, name, result.key_rule)
            check = (row_count_check(builder, name, result.key_rule, live,
                                     result.applied_version)
                     if dg.AssetCheckKey(key, ROW_COUNT_CHECK) in checked else None)
            seconds = (applied - began, time.monotonic() - applied)
            return result, live, check, seconds

        workers = max(1, min(len(selected), pipeline.spark.parallel_replicas))
        with ThreadPoolExecutor(workers, thread_name_prefix="replica") as pool:
            for key, future in [(key, pool.submit(build, key)) for key in selected]:
                result, live, check, (apply_s, count_s) = future.result()
                append = result.key_rule == APPEND_ONLY
                context.log.info(f"replica {key.path[-1]}: {live} "
                                 f"{'changes' if append else 'live rows'}; applied in "
                                 f"{apply_s:.1f}s, counted and checked in {count_s:.1f}s; "
                                 f"{result}")
                if result.warning:
                    context.log.warning(result.warning)
                md = replica_metadata(result, live)
                md["apply_seconds"] = dg.MetadataValue.float(round(apply_s, 3))
                yield dg.MaterializeResult(asset_key=key, metadata=md)
                if check is not None:
                    yield check

    return replicas


def counted_rows(builder, name: str, key_rule: str | None) -> int:
    """The replica's live rows (`_current`); an append-only replica has no live rows to
    tell apart, so all its rows count; 0 before it has a table."""
    from binlog_assets.lakehouse.identifiers import qualified
    from binlog_assets.lakehouse.replica import APPEND_ONLY

    if key_rule is None:
        return 0
    table = (builder.table_name(name) if key_rule == APPEND_ONLY
             else builder.current_view_name(name))
    return builder.spark.table(qualified(*table)).count()


def row_count_check(builder, name: str, key_rule: str | None, live: int, version: int
                    ) -> dg.AssetCheckResult:
    """`row_count_matches_changelog` for `live` rows counted at changelog `version`."""
    from binlog_assets.lakehouse.audit import expected_live_rows, expected_log_rows
    from binlog_assets.lakehouse.replica import APPEND_ONLY

    expected = (expected_log_rows if key_rule == APPEND_ONLY else expected_live_rows)(
        builder.spark, builder.config, name, version)
    return row_count_check_result(replica_key(name), live, expected, version)


def replica_metadata(result, live_rows: int | None) -> dict[str, dg.MetadataValue]:
    """What an apply did; `rows` (live rows after it) when counted."""
    md = {} if live_rows is None else {"rows": dg.MetadataValue.int(live_rows)}
    md |= {
        "changelog_rows_read": dg.MetadataValue.int(result.rows),
        "applied_changelog_version": dg.MetadataValue.int(result.applied_version),
        "upserts": dg.MetadataValue.int(result.upserts),
        "deletes": dg.MetadataValue.int(result.deletes),
        "tombstones": dg.MetadataValue.int(result.tombstones),
        "truncated": dg.MetadataValue.int(result.truncated),
    }
    if result.last_position is not None:
        md["last_position"] = dg.MetadataValue.text(str(result.last_position))
    if result.key_rule is not None:
        md["key_rule"] = dg.MetadataValue.text(result.key_rule)
    if result.warning:
        md["warning"] = dg.MetadataValue.text(result.warning)
    return md
