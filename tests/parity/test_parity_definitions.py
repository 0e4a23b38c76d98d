"""The parity check's Dagster definitions: which replicas get one, the job and schedule."""

from __future__ import annotations

import dagster as dg

from binlog_assets.config import parse_config
from binlog_assets.orchestration.parity_checks import (
    PARITY_CHECK,
    PARITY_JOB_NAME,
    build_parity_checks,
    checked_replicas,
    parity_job,
    parity_schedule,
)
from binlog_assets.orchestration.replica_assets import build_replica_assets
from binlog_assets.orchestration.resources import BinlakeResource

CONNECTION = {"host": "db.example.com", "user": "binlake_check"}


def _config(**parity):
    return parse_config({"parity": parity, "sources": [
        {"name": "shop", "topics": ["shop.a", "shop.b"], "connection": CONNECTION,
         "tables": [{"source": "shop.a", "replica": "a"},
                    {"source": "shop.log", "replica": "log", "replica_mode": "append"}]},
        {"name": "other", "topics": ["other.c"],
         "tables": [{"source": "other.c", "replica": "c"}]}]})


def test_replicas_with_a_source_connection_get_a_parity_check_and_a_job() -> None:
    pipeline = _config()
    # `c`'s source has no connection; `log` (a log of changes) is checked by replaying it.
    assert checked_replicas(pipeline) == ["a", "log"]
    job = parity_job(pipeline)
    defs = dg.Definitions(assets=[build_replica_assets(pipeline)],
                          asset_checks=build_parity_checks(pipeline), jobs=[job],
                          resources={"binlake": BinlakeResource()})
    resolved = defs.resolve_job_def(PARITY_JOB_NAME)
    assert resolved.asset_layer.asset_graph.asset_check_keys >= {
        dg.AssetCheckKey(dg.AssetKey(["replica", "a"]), PARITY_CHECK)}
    assert resolved.asset_layer.selected_asset_keys == set()  # checks only, no build
    assert parity_schedule(pipeline, job) is None  # no schedule unless configured


def test_the_schedule_is_off_until_turned_on() -> None:
    pipeline = _config(schedule="0 3 * * *")
    schedule = parity_schedule(pipeline, parity_job(pipeline))
    assert schedule.cron_schedule == "0 3 * * *"
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED


def test_no_connection_no_check() -> None:
    pipeline = parse_config({"sources": [{"name": "s", "topics": ["t"],
                                     "tables": [{"source": "d.t", "replica": "r"}]}]})
    assert build_parity_checks(pipeline) == [] and parity_job(pipeline) is None
