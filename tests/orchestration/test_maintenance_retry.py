"""A maintenance run whose Spark Connect server stops or restarts under it is retried
with a new session; any other failure fails the run at once (the soak's Spark restart
failed a maintenance run before)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.lakehouse import spark as spark_module
from binlog_assets.orchestration import maintenance
from binlog_assets.orchestration.resources import BinlakeResource

REMOTE = "sc://127.0.0.1:15999"


class FakeSession:
    def __init__(self, answers: bool) -> None:
        self.answers, self.stopped = answers, False

    def sql(self, _query: str) -> FakeSession:
        return self

    def collect(self) -> list:
        if not self.answers:
            raise RuntimeError("[INVALID_HANDLE.SESSION_CHANGED] the server restarted")
        return [(1,)]

    def stop(self) -> None:
        self.stopped = True


def _pipeline(tmp_path: Path) -> PipelineConfig:
    return parse_config({"lakehouse": {"path": str(tmp_path / "lake")},
                         "spark": {"remote": REMOTE}})


def test_a_session_that_no_longer_answers_is_lost_and_forgotten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = _pipeline(tmp_path)
    assert not spark_module.remote_session_lost(pipeline)  # none opened: nothing lost
    alive, gone = FakeSession(answers=True), FakeSession(answers=False)
    monkeypatch.setitem(spark_module._REMOTE_SESSIONS, REMOTE, alive)
    assert not spark_module.remote_session_lost(pipeline)
    monkeypatch.setitem(spark_module._REMOTE_SESSIONS, REMOTE, gone)
    assert spark_module.remote_session_lost(pipeline)
    spark_module.forget_remote_session(pipeline)
    assert gone.stopped and REMOTE not in spark_module._REMOTE_SESSIONS
    local = parse_config({"lakehouse": {"path": str(tmp_path / "lake")}})
    assert not spark_module.remote_session_lost(local)


class SilentSession(FakeSession):
    """A server that went away while the client retries: the probe never returns."""

    def __init__(self) -> None:
        super().__init__(answers=True)
        self.release = threading.Event()

    def collect(self) -> list:
        self.release.wait(60)
        return [(1,)]


def test_a_probe_the_server_never_answers_finds_the_session_lost() -> None:
    # The soak's follower sat 21 minutes in the probe, inside the client's retries.
    silent = SilentSession()
    began = time.monotonic()
    try:
        assert spark_module.session_lost(silent, timeout=0.5)
    finally:
        silent.release.set()
    assert time.monotonic() - began < 5
    assert not spark_module.session_lost(FakeSession(answers=True), timeout=5)
    assert spark_module.session_lost(FakeSession(answers=False), timeout=5)


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, lost: bool
         ) -> tuple[dg.ExecuteInProcessResult, list[int], list[str]]:
    config = tmp_path / "binlake.yaml"
    config.write_text(yaml.safe_dump(_pipeline(tmp_path).model_dump(mode="json",
                                                                    exclude_none=True)))
    attempts: list[int] = []

    def maintain(context, binlake):
        attempts.append(len(attempts))
        if len(attempts) == 1:
            raise RuntimeError("Cannot call methods on a stopped SparkContext.")
        yield dg.AssetObservation(asset_key=maintenance.CHANGELOG_ASSET_KEY)

    forgotten: list[str] = []
    monkeypatch.setattr(maintenance, "_maintain", maintain)
    monkeypatch.setattr(maintenance, "SPARK_LOST_WAIT_SECONDS", 0.0)
    monkeypatch.setattr(spark_module, "remote_session_lost", lambda pipeline: lost)
    monkeypatch.setattr(spark_module, "forget_remote_session",
                        lambda pipeline: forgotten.append(pipeline.spark.remote))
    defs = dg.Definitions(jobs=[maintenance.lakehouse_maintenance_job],
                          resources={"binlake": BinlakeResource(config_path=str(config))})
    result = defs.resolve_job_def(maintenance.MAINTENANCE_JOB_NAME).execute_in_process(
        raise_on_error=False)
    return result, attempts, forgotten


def test_a_run_that_lost_its_spark_connect_server_is_retried_with_a_new_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result, attempts, forgotten = _run(tmp_path, monkeypatch, lost=True)
    assert result.success and attempts == [0, 1] and forgotten == [REMOTE]
    retried = [e for e in result.all_events
               if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    assert len(retried) == 1 and "stopped SparkContext" in str(retried[0].event_specific_data)


def test_any_other_failure_fails_the_run_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result, attempts, forgotten = _run(tmp_path, monkeypatch, lost=False)
    assert not result.success and attempts == [0] and forgotten == []
