"""A STARTED run whose process is gone (and the code server that launched it with it) is
failed by the follower sensors, so they start the next run.

The soak found it: the code server's child was killed, then the changelog follower run
it had launched; the run stayed STARTED, `changelog_follower_sensor` waited on it, and
nothing consumed Kafka again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import DagsterEvent, DagsterEventType, EngineEventData
from dagster._core.test_utils import create_run_for_test

from binlog_assets.environment import REPO_ROOT
from binlog_assets.orchestration import lost_runs
from binlog_assets.orchestration.lost_runs import fail_lost_run, unfinished_runs, worker_pid
from binlog_assets.orchestration.shared import UNFINISHED

JOB = "follow_changelog_job"


def started(instance: dg.DagsterInstance, pid: int) -> dg.DagsterRun:
    """A run STARTED as the run worker reports it: its start, then its process."""
    run = create_run_for_test(instance, job_name=JOB, status=dg.DagsterRunStatus.STARTING)
    instance.report_dagster_event(
        DagsterEvent(event_type_value=DagsterEventType.RUN_START.value, job_name=JOB),
        run_id=run.run_id)
    instance.report_engine_event(f"Executing steps in process (pid: {pid})", run,
                                 EngineEventData.in_process(pid))
    return instance.get_run_by_id(run.run_id)


def gone_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def instance(tmp_path: Path):
    home = tmp_path / "dagster"
    home.mkdir()
    shutil.copy(REPO_ROOT / "setup" / "dagster.yaml", home / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        yield instance


def test_a_run_whose_process_is_gone_is_failed(instance: dg.DagsterInstance) -> None:
    pid = gone_pid()
    run = started(instance, pid)
    assert run.status == dg.DagsterRunStatus.STARTED
    assert worker_pid(instance, run.run_id) == pid
    assert unfinished_runs(instance, JOB, UNFINISHED) == []
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
    assert any(f"process {pid} is gone" in (e.message or "") for e in
               instance.all_logs(run.run_id, of_type=DagsterEventType.RUN_FAILURE))


def test_a_run_whose_process_lives_is_left_alone(instance: dg.DagsterInstance) -> None:
    run = started(instance, os.getpid())  # this process started before the run
    assert [r.run_id for r in unfinished_runs(instance, JOB, UNFINISHED)] == [run.run_id]
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED
    starting = create_run_for_test(instance, job_name=JOB,
                                   status=dg.DagsterRunStatus.STARTING)
    assert not fail_lost_run(instance, starting)  # not started: run monitoring's case


def test_a_process_started_after_the_run_is_not_its_worker(
        instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch) -> None:
    # The boot time /proc gives is in whole seconds: a process 5 s younger than its
    # "run" stands for one started minutes after it.
    monkeypatch.setattr(lost_runs, "START_SLACK_SECONDS", -5.0)
    run = started(instance, gone_pid())
    other = subprocess.Popen(["sleep", "30"])
    try:
        # The run's pid, taken since by a process that started after the run.
        monkeypatch.setattr(lost_runs, "worker_pid", lambda *_: other.pid)
        assert fail_lost_run(instance, run)
    finally:
        other.kill()
        other.wait()


def test_a_runs_worker_is_looked_up_once(instance: dg.DagsterInstance,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The follower sensors ask at every tick: the worker's pid and the run's start are
    read from the instance once, then only /proc is."""
    run = started(instance, os.getpid())
    reads: list[str] = []
    for name in ("get_records_for_run", "get_run_record_by_id"):
        real = getattr(instance, name)
        monkeypatch.setattr(instance, name, lambda *a, real=real, name=name, **k: (
            reads.append(name), real(*a, **k))[1])
    for _tick in range(3):
        assert [r.run_id for r in unfinished_runs(instance, JOB, UNFINISHED)] == [run.run_id]
    assert sorted(reads) == ["get_records_for_run", "get_run_record_by_id"]


@pytest.mark.parametrize("launcher", ["no-server-named", "server-gone"])
def test_terminating_a_run_whose_code_server_is_gone_interrupts_its_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: str) -> None:
    """`make dev`'s Ctrl-C (and the soak's end) terminate runs as the UI does, through
    the code server that launched each. With that server killed, the run stayed
    CANCELING and its process kept running: now the process is interrupted as the
    server would, and a run whose process then ends without a word is marked canceled."""
    from dagster._core.launcher.default_run_launcher import GRPC_INFO_TAG

    from binlog_assets.dev.dagster_dev import terminate_runs

    home = tmp_path / "dagster"
    home.mkdir()
    shutil.copy(REPO_ROOT / "setup" / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    worker = subprocess.Popen(["sleep", "60"])
    try:
        with dg.DagsterInstance.get() as instance:
            run = started(instance, worker.pid)
            if launcher == "server-gone":
                instance.add_run_tags(run.run_id, {GRPC_INFO_TAG: json.dumps(
                    {"socket": str(tmp_path / "gone.sock"), "host": "localhost"})})
        terminate_runs(30.0)
        assert worker.wait(timeout=10) == -signal.SIGINT
        with dg.DagsterInstance.get() as instance:
            assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.CANCELED
    finally:
        worker.kill()
        worker.wait()
