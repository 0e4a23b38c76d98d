"""`make dev`: `dagster dev -w workspace.yaml` that one Ctrl-C stops, runs included.

`dagster dev` runs in a process group of its own, so the terminal's SIGINT reaches only
this process, which then stops it in order: the runs in progress are terminated as the
UI's Terminate does (each interrupted in its step, reported CANCELED), then the whole
group gets SIGINT, and whatever is left of it after a grace period SIGKILL. Left alone,
`dagster dev` waits up to a minute for each of its webserver and daemon. The local stack
(broker, Spark Connect, Redis) runs in sessions of its own and stays up for the next
`make dev`; `make stack-down` stops it.

Meanwhile a watch (`code_watch`) pings the code servers `dagster dev` started and
reloads one that stopped answering, as the UI's Reload button would: their child
process, which serves the location, is never started again otherwise.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from binlog_assets.dev.code_watch import (
    CodeWatch,
    dagster_dev_workspace,
    endpoints_from_workspace,
    with_heartbeat_ttl,
)

# Seconds the runs in progress get to end once terminated, then the group once signalled:
# together under the 10 s a Ctrl-C may take.
RUNS_GRACE = 5.0
GROUP_GRACE = 3.0


def main(argv: list[str] | None = None) -> int:
    args = ["-w", "workspace.yaml"] if argv is None else argv
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    proc = subprocess.Popen([str(Path(sys.executable).with_name("dagster")), "dev", *args],
                            start_new_session=True, env=with_heartbeat_ttl(dict(os.environ)))
    watch = CodeWatch(lambda: _code_servers(proc.pid),
                      log=lambda line: print(f"binlake: {line}", flush=True))
    watch.start()
    while proc.poll() is None and not stop.wait(0.5):
        pass
    watch.stop.set()
    if proc.poll() is not None:
        return proc.returncode
    print("binlake: stopping dagster dev (runs in progress are terminated)", flush=True)
    terminate_runs(RUNS_GRACE)
    return stop_group(proc, GROUP_GRACE)


def _code_servers(group: int) -> list:
    workspace = dagster_dev_workspace(group)
    return endpoints_from_workspace(workspace) if workspace is not None else []


def terminate_runs(grace: float) -> None:
    """Terminate the instance's runs in progress as the UI does, and wait up to `grace`
    seconds for them to end."""
    import dagster as dg

    from binlog_assets.orchestration.lost_runs import cancel_ended_run, interrupt_run

    with dg.DagsterInstance.get() as instance:
        statuses = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
                    dg.DagsterRunStatus.CANCELING]
        runs = [r.dagster_run for r in
                instance.get_run_records(dg.RunsFilter(statuses=statuses))]
        for run in runs:
            try:
                if instance.run_coordinator.cancel_run(run.run_id):
                    continue
                error = None
            except Exception as e:
                error = e
            # The code server that launched the run is gone (killed, or ended when its
            # heartbeats stopped): its run process is interrupted as that server would.
            if interrupt_run(instance, run) is None and error is not None:
                print(f"binlake: could not terminate run {run.run_id}: {error}", flush=True)
        ids = [run.run_id for run in runs]
        deadline = time.monotonic() + grace
        while ids and time.monotonic() < deadline:
            left = [r.dagster_run for r in instance.get_run_records(
                dg.RunsFilter(run_ids=ids, statuses=statuses))]
            # Each one looked at, not only up to the first still running.
            if all([cancel_ended_run(instance, run) for run in left]):
                break
            time.sleep(0.2)


def stop_group(proc: subprocess.Popen, grace: float) -> int:
    """SIGINT `proc`'s process group, SIGKILL what is left of it after `grace` seconds."""
    group = proc.pid  # its own session: the group id is its pid
    _signal_group(group, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    # The webserver, daemon and code servers may outlive dagster dev itself.
    _signal_group(group, signal.SIGKILL)
    proc.wait()
    return 130  # as a shell reports a command ended by Ctrl-C


def _signal_group(group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, sig)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or None))
