"""A follower run whose process is gone is failed, so its sensor can start the next.

Runs started by Dagster's DefaultRunLauncher are processes of the code server that
launched them, on this host. That code server notices when one of them dies and fails
it; when the code server's own process went first (killed, or ended when it missed its
heartbeats), nobody does: run monitoring cannot check such a run's worker, the run stays
STARTED for good, and a sensor that keeps one follower run going waits on it forever.
The follower sensors look up the run's worker (the pid its ENGINE_EVENT names) and fail
the run when that process is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal

import dagster as dg
from dagster._core.events import DagsterEventType
from dagster._core.launcher import DefaultRunLauncher

from binlog_assets.procfs import process

# A process started this long after its run's start is another process with the pid.
START_SLACK_SECONDS = 120.0
# Each STARTED run's worker pid and start, found once: the sensors ask every tick
# (about a second), and the answer never changes.
_WORKERS: dict[str, tuple[int, float]] = {}
KNOWN_WORKERS = 256


def worker_pid(instance: dg.DagsterInstance, run_id: str) -> int | None:
    """The pid of the process that executes the run's steps, from its engine events."""
    records = instance.get_records_for_run(
        run_id, of_type=DagsterEventType.ENGINE_EVENT, limit=20).records
    for record in records:
        event = record.event_log_entry.dagster_event
        data = event.engine_event_data if event is not None else None
        pid = data.metadata.get("pid") if data is not None and data.metadata else None
        if pid is not None:
            return int(pid.value)
    return None


def run_worker(instance: dg.DagsterInstance, run: dg.DagsterRun) -> tuple[int, bool] | None:
    """(pid, alive) of the process executing `run`; None when the run names none (not
    started by this host's DefaultRunLauncher)."""
    if not isinstance(instance.run_launcher, DefaultRunLauncher):
        return None
    known = _WORKERS.get(run.run_id)
    if known is None:
        pid = worker_pid(instance, run.run_id)
        record = instance.get_run_record_by_id(run.run_id)
        if pid is None or record is None or record.start_time is None:
            return None
        if len(_WORKERS) >= KNOWN_WORKERS:
            _WORKERS.clear()
        known = _WORKERS[run.run_id] = (pid, record.start_time)
    pid, run_start = known
    worker = process(pid)
    return pid, (worker is not None and worker.alive
                 and worker.started_at <= run_start + START_SLACK_SECONDS)


def _gone(instance: dg.DagsterInstance, run: dg.DagsterRun) -> int | None:
    """The pid of `run`'s process when that process is gone and the run, read after it,
    still unfinished (a run that ends writes its end before its process exits)."""
    found = run_worker(instance, run)
    if found is None or found[1]:
        return None
    current = instance.get_run_by_id(run.run_id)
    return found[0] if current is not None and current.status == run.status else None


def fail_lost_run(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    """Fail `run` if it is STARTED by this host's DefaultRunLauncher and the process that
    executes it is gone; whether it did."""
    pid = _gone(instance, run) if run.status == dg.DagsterRunStatus.STARTED else None
    if pid is None:
        return False
    instance.report_run_failed(
        run, f"the run's process {pid} is gone and so is the code server that launched "
             "it: nothing else would fail the run, and its sensor would wait on it")
    return True


def interrupt_run(instance: dg.DagsterInstance, run: dg.DagsterRun) -> int | None:
    """Interrupt the live process executing `run` (SIGINT, which is how its code
    server's termination reaches it) when that server cannot; its pid, else None."""
    found = run_worker(instance, run)
    if found is None or not found[1]:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(found[0], signal.SIGINT)
    return found[0]


def cancel_ended_run(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    """Mark canceled `run`, asked to stop, when its process ended without recording its
    end; whether it did."""
    pid = None if run.is_finished else _gone(instance, run)
    if pid is None:
        return False
    instance.report_run_canceled(
        run, f"the run's process {pid} ended after it was asked to stop, without "
             "recording its end")
    return True


def unfinished_runs(instance: dg.DagsterInstance, job_name: str,
                    statuses: list[dg.DagsterRunStatus]) -> list[dg.DagsterRun]:
    """The job's runs in `statuses`, less those failed here as lost."""
    runs = instance.get_runs(filters=dg.RunsFilter(job_name=job_name, statuses=statuses))
    return [run for run in runs if not fail_lost_run(instance, run)]
