"""The load's Dagster side without a database: the job's ops, and which replicas
`initial_load_sensor` loads."""

from __future__ import annotations

import dagster as dg

from binlog_assets.config import parse_config
from binlog_assets.orchestration.load_job import (
    LOAD_JOB_NAME,
    initial_load_sensor,
    load_replica_job,
)

CONNECTION = {"host": "127.0.0.1", "port": 3306, "user": "binlake_check"}


def _config(tables, **load):
    return parse_config({"load": load, "sources": [
        {"name": "shop", "topics": ["shop.a"], "connection": CONNECTION,
         "tables": [{"source": f"shop.{t}", "replica": t} for t in tables]},
        {"name": "other", "topics": ["other.c"],
         "tables": [{"source": "other.z", "replica": "z"}]}]})


def test_the_job_plans_loads_and_applies() -> None:
    assert load_replica_job.name == LOAD_JOB_NAME
    ops = [n.name for n in load_replica_job.nodes_in_topological_order]
    assert ops == ["plan_load", "prepare_load", "load_chunks", "apply_loaded"]


def _requested(sensor, instance, cursor=None):
    context = dg.build_sensor_context(instance=instance, cursor=cursor)
    requests = [r for r in sensor(context) if isinstance(r, dg.RunRequest)]
    return [r.run_config["ops"]["plan_load"]["config"]["replica"] for r in requests], \
        context.cursor


def test_new_replicas_are_loaded_once_and_never_built_ones_at_the_first_tick() -> None:
    assert initial_load_sensor(_config(["a", "b"])) is None  # off by default
    sensor = initial_load_sensor(_config(["a", "b"], new_replicas=True))
    assert sensor.job_name == LOAD_JOB_NAME
    with dg.instance_for_test() as instance:
        # `b` was built before (its source's snapshot); `a` never was; `z`'s source has
        # no connection to load from.
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=dg.AssetKey(["replica", "b"])))
        first, cursor = _requested(sensor, instance)
        assert first == ["a"]
        again, cursor = _requested(sensor, instance, cursor)
        assert again == []
        # binlake.yaml gains `c`, whose stream may have built it already: loaded too.
        grown = initial_load_sensor(_config(["a", "b", "c"], new_replicas=True))
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=dg.AssetKey(["replica", "c"])))
        later, cursor = _requested(grown, instance, cursor)
        assert later == ["c"]
        assert _requested(grown, instance, cursor)[0] == []
