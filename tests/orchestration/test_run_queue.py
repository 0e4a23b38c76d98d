"""A run dequeued while its code location is unreachable goes back to the queue.

The soak found it: a maintenance run dequeued in the second the code server's child was
killed failed at once (`Could not reach user code server` from the run launcher), though
the location answered again 24 s later. The shipped instance (setup/dagster.yaml) has
the queue retry such a launch instead.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from unittest import mock

import dagster as dg
from dagster._core.errors import DagsterUserCodeUnreachableError
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.remote_origin import (
    GrpcServerCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.test_utils import create_run_for_test
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
    QueuedRunCoordinatorDaemon,
)

from binlog_assets.environment import REPO_ROOT


def _enqueued(instance: dg.DagsterInstance) -> dg.DagsterRun:
    location = GrpcServerCodeLocationOrigin(host="127.0.0.1", port=4000,
                                            location_name="binlake")
    origin = RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"),
                             "lakehouse_maintenance_job")
    run = create_run_for_test(instance, job_name="lakehouse_maintenance_job",
                              status=dg.DagsterRunStatus.QUEUED, remote_job_origin=origin)
    instance.report_dagster_event(
        DagsterEvent(event_type_value=DagsterEventType.PIPELINE_ENQUEUED.value,
                     job_name=run.job_name), run_id=run.run_id)
    return run


def test_a_launch_that_cannot_reach_the_location_is_retried(tmp_path: Path) -> None:
    home = tmp_path / "dagster"
    home.mkdir()
    shutil.copy(REPO_ROOT / "setup" / "dagster.yaml", home / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        run = _enqueued(instance)
        daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)
        config = instance.get_concurrency_config()
        retries = config.run_queue_config.max_user_code_failure_retries
        delay = config.run_queue_config.user_code_failure_retry_delay
        assert retries >= 3 and retries * delay >= 90  # the watch's reload fits in
        unreachable = DagsterUserCodeUnreachableError("Could not reach user code server")
        now = time.time()
        with mock.patch.object(instance.run_launcher, "launch_run", side_effect=unreachable):
            for attempt in range(retries):
                daemon._dequeue_run(instance, None, run, config, now + attempt * (delay + 1))
                assert instance.get_run_by_id(run.run_id).status == \
                    dg.DagsterRunStatus.QUEUED, attempt
            # The location stays unreachable: the queue gives up and says why.
            daemon._dequeue_run(instance, None, run, config, now + retries * (delay + 1))
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
