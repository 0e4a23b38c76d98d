"""A run that dies holding the `spark` pool's slot gives it back.

The shipped instance (setup/dagster.yaml) lets one Spark step run at a time (the `spark`
pool, `default_limit: 1`). A step claims the slot when it starts and frees it when it
ends; a SIGKILLed run never ends its step, so the slot stays claimed after run
monitoring has marked the run failed, and every later replica follower, replica build
and dbt run waits in the queue for good. The soak found it: after a SIGKILL of the
replica follower, the next follower stayed QUEUED with the killed run's claim still in
`concurrency_slots`. The daemon's monitoring frees the slots of ended runs only when
`run_monitoring.free_slots_after_run_end_seconds` is set.
"""

from __future__ import annotations

import datetime
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import dagster as dg
from dagster._core.test_utils import create_run_for_test
from dagster._daemon.monitoring import concurrency

from binlog_assets.environment import REPO_ROOT

POOL = "spark"


def test_the_pool_slot_of_a_run_killed_in_its_step_is_freed(tmp_path: Path) -> None:
    home = tmp_path / "dagster"
    home.mkdir()
    shutil.copy(REPO_ROOT / "setup" / "dagster.yaml", home / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        storage = instance.event_log_storage
        assert storage.supports_global_concurrency_limits
        storage.set_concurrency_slots(POOL, 1)
        killed = create_run_for_test(instance, job_name="follow_replicas_job",
                                     status=dg.DagsterRunStatus.STARTED)
        storage.claim_concurrency_slot(POOL, killed.run_id, "follow_replicas")
        assert storage.get_concurrency_info(POOL).active_slot_count == 1
        # What run monitoring does on finding the run's process gone.
        instance.report_run_failed(killed, "run worker process died (SIGKILL)")
        ended = instance.get_run_record_by_id(killed.run_id).end_time
        assert ended is not None

        later = datetime.datetime.fromtimestamp(ended + 600, tz=datetime.UTC)
        with mock.patch.object(concurrency, "get_current_datetime", return_value=later):
            list(concurrency.execute_concurrency_slots_iteration(
                SimpleNamespace(instance=instance), logging.getLogger("test")))

        assert storage.get_concurrency_info(POOL).active_slot_count == 0
