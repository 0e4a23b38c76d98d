"""The parity check's Dagster definitions: which replicas get one, the job and schedule."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import yaml

from binlog_assets.config import parse_config
from binlog_assets.orchestration.dbt_follow import dbt_follow_sensor
from binlog_assets.orchestration.parity_checks import (
    PARITY_CHECK,
    PARITY_JOB_NAME,
    build_parity_checks,
    checked_replicas,
    failed_parity,
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


def _block_dbt_resource(tmp_path: Path, block: bool) -> BinlakeResource:
    tmp_path.mkdir()
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(_config(block_dbt=block).model_dump(
        mode="json", exclude_none=True)))
    return BinlakeResource(config_path=str(path))


def _parity(instance: dg.DagsterInstance, replica: str, passed: bool) -> None:
    instance.report_runless_asset_event(dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey(["replica", replica]), check_name=PARITY_CHECK, passed=passed,
        severity=dg.AssetCheckSeverity.ERROR))


def test_a_failed_parity_check_holds_dbt_back_until_one_passes(tmp_path: Path) -> None:
    blocking, not_blocking = (_block_dbt_resource(tmp_path / n, b) for n, b in
                              (("on", True), ("off", False)))
    with dg.instance_for_test() as instance:
        def tick(binlake: BinlakeResource):
            return dbt_follow_sensor({dg.AssetKey("mart"): {dg.AssetKey(["replica", "a"])}})(
                dg.build_sensor_context(instance=instance, resources={"binlake": binlake}))

        instance.report_runless_asset_event(dg.AssetMaterialization(["replica", "a"]))
        _parity(instance, "c", passed=False)  # `c` has no parity check: not counted
        _parity(instance, "a", passed=True)
        assert failed_parity(instance, blocking.pipeline) == []
        assert tick(blocking).run_requests
        _parity(instance, "log", passed=False)
        assert failed_parity(instance, blocking.pipeline) == ["log"]
        held = tick(blocking)
        assert isinstance(held, dg.SkipReason)
        assert "parity check of log failed" in held.skip_message
        assert tick(not_blocking).run_requests  # off by default: dbt builds regardless
        _parity(instance, "log", passed=True)  # re-synced, checked equal
        assert tick(blocking).run_requests


def test_a_failed_check_launches_a_resync_of_each_chunk_it_found_wrong_once() -> None:
    from binlog_assets.orchestration.resync_job import RESYNC_JOB_NAME, parity_resync_sensor

    assert parity_resync_sensor(_config()) is None  # off by default
    sensor = parity_resync_sensor(_config(resync=True))
    assert sensor.job_name == RESYNC_JOB_NAME
    with dg.instance_for_test() as instance:
        mismatches = [
            {"table": "shop.a", "range": "(-inf, 28]", "lower": None, "upper": [28]},
            {"table": "shop.a", "range": "(53, 78]", "lower": [53], "upper": [78]},
            # A key with no exact JSON form: the whole table, once.
            {"table": "shop.a", "range": "(2026-01-01, 2026-02-01]"},
            {"table": "shop.a", "range": "(2026-02-01, +inf]"},
            {"table": "shop.log", "range": "all rows (a log of changes, replayed)"}]
        for replica in ("a", "log"):
            instance.report_runless_asset_event(dg.AssetCheckEvaluation(
                asset_key=dg.AssetKey(["replica", replica]), check_name=PARITY_CHECK,
                passed=False, severity=dg.AssetCheckSeverity.ERROR,
                metadata={"mismatches": dg.MetadataValue.json(
                    [m for m in mismatches if m["table"] == f"shop.{replica}"])}))
        context = dg.build_sensor_context(instance=instance)
        requests = [r for r in sensor(context) if isinstance(r, dg.RunRequest)]
        configs = [r.run_config["ops"]["resync_replica"]["config"] for r in requests]
        assert configs == [
            {"replica": "a", "table": "shop.a", "lower": "", "upper": "[28]"},
            {"replica": "a", "table": "shop.a", "lower": "[53]", "upper": "[78]"},
            {"replica": "a", "table": "shop.a"}]  # a log of changes is not re-synced
        assert len({r.run_key for r in requests}) == 3

        # The same failed checks again: nothing; a newer failed one: its chunks.
        again = dg.build_sensor_context(instance=instance, cursor=context.cursor)
        assert [r for r in sensor(again) if isinstance(r, dg.RunRequest)] == []
        _parity(instance, "a", passed=True)
        later = dg.build_sensor_context(instance=instance, cursor=again.cursor)
        assert [r for r in sensor(later) if isinstance(r, dg.RunRequest)] == []


def test_a_failed_check_names_each_chunk_as_the_resync_job_takes_it() -> None:
    from datetime import date

    from binlog_assets.orchestration.parity_checks import parity_result
    from binlog_assets.parity.check import Mismatch, ParityReport
    from binlog_assets.parity.chunks import KeyRange

    report = ParityReport("a", mismatches=[
        Mismatch("shop.a", "(-inf, 28]", 3, 2, ["shop.a 7: missing in replica"],
                 KeyRange(None, (28,))),
        Mismatch("shop.b", "(20, 3, +inf]", 1, 1, [], KeyRange((20, "x"), None)),
        Mismatch("shop.c", "(2026-01-01, +inf]", 1, 0, [], KeyRange((date(2026, 1, 1),), None)),
        Mismatch("shop.log", "all rows (a log of changes, replayed)", 5, 4, [])])
    md = parity_result(dg.AssetKey(["replica", "a"]), report, 10).metadata
    assert [{k: m.get(k, "-") for k in ("table", "lower", "upper")}
            for m in md["mismatches"].value] == [
        {"table": "shop.a", "lower": None, "upper": [28]},
        {"table": "shop.b", "lower": [20, "x"], "upper": None},
        {"table": "shop.c", "lower": "-", "upper": "-"},  # no exact JSON form of a date
        {"table": "shop.log", "lower": "-", "upper": "-"}]


def test_a_check_still_running_when_the_sensor_ticks_is_resynced_once_it_fails(
        monkeypatch) -> None:
    from types import SimpleNamespace

    from dagster._core.storage.asset_check_execution_record import (
        AssetCheckExecutionRecordStatus as Status,
    )

    from binlog_assets.orchestration.resync_job import parity_resync_sensor

    sensor = parity_resync_sensor(_config(resync=True))
    a = dg.AssetCheckKey(dg.AssetKey(["replica", "a"]), PARITY_CHECK)
    log = dg.AssetCheckKey(dg.AssetKey(["replica", "log"]), PARITY_CHECK)
    failed = {"mismatches": dg.MetadataValue.json(
        [{"table": "shop.a", "range": "(-inf, 28]", "lower": None, "upper": [28]}])}

    def record(id_: int, status, metadata=None):
        evaluation = SimpleNamespace(metadata=metadata or {})
        return SimpleNamespace(id=id_, status=status, event=SimpleNamespace(
            dagster_event=SimpleNamespace(asset_check_evaluation_data=evaluation)))

    with dg.instance_for_test() as instance:
        latest: dict = {}
        monkeypatch.setattr(instance.event_log_storage,
                            "get_latest_asset_check_execution_by_key", lambda keys: latest)
        # One run checks both: a's check is still planned when log's passed.
        latest.update({a: record(5, Status.PLANNED), log: record(6, Status.SUCCEEDED)})
        first = dg.build_sensor_context(instance=instance)
        assert [r for r in sensor(first) if isinstance(r, dg.RunRequest)] == []
        latest[a] = record(5, Status.FAILED, failed)
        then = dg.build_sensor_context(instance=instance, cursor=first.cursor)
        requests = [r for r in sensor(then) if isinstance(r, dg.RunRequest)]
        assert [r.run_key for r in requests] == ["parity-5-0"]
