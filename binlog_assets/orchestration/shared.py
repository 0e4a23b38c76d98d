"""Names and rules the orchestration modules share: jobs, run tags, the Spark pool, the
sensors' interval and the condition by which assets follow their upstream.

Asset, sensor and job modules import these from here rather than from each other.
"""

from __future__ import annotations

import dagster as dg

# The one asset group of both code locations (Kafka sources, changelog, replicas, dbt
# models): one graph on one page.
ASSET_GROUP = "binlake"
CONSUME_JOB_NAME = "consume_changelog_job"
CHANGELOG_FOLLOW_JOB_NAME = "follow_changelog_job"
DBT_JOB_NAME = "dbt_build_job"
BUILD_JOB_NAME = "build_replicas_job"
# A follower run launched while its `dagster.*_follow_seconds` is 0 (followers off) lasts
# this long; a replica or partition that failed in a follower is retried after RETRY.
FOLLOW_RUN_SECONDS = 300.0
FOLLOW_RETRY_SECONDS = 30.0
# The tags by which Dagster runs a partitioned asset over a range of its partitions.
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
PARTITION_TAG = "dagster/partition"
# Why the lag sensor requested a run: `lag_threshold` (a partition's lag reached
# dagster.lag_threshold) or `staleness` (it lagged longer than max_staleness_seconds),
# and the records its due partitions lagged by then.
REASON_TAG = "binlake/reason"
LAG_TAG = "binlake/lag"
# On a follower's report that a replica is current at a newer changelog version with the
# same data (replica_versions.py): dbt does not rebuild for it.
IN_SYNC_TAG = "binlake/in_sync"
# Runs that hold their partitions: everything not finished.
UNFINISHED = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
              dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
              dg.DagsterRunStatus.CANCELING]

# Dagster's daemons evaluate sensors and automation in a loop of 5 s. A minimum interval
# equal to that loop skips every other pass whenever one starts a hair early (ticks came
# 5 or 10 s apart): under it, these sensors tick on every pass.
EVERY_DAEMON_PASS = 1

# Every job runs its steps in the run's own process: a subprocess per step would load
# the code location again (3-7 s). The replica steps share one Spark session; dbt's step
# only waits on the dbt CLI (whose Spark is its own, or the Spark Connect server's).
ONE_PROCESS = dg.in_process_executor

# Every step that starts Spark takes a slot of this pool. The local catalog is embedded
# Derby, which admits one JVM at a time, so dagster.yaml gives pools one slot; with a
# real metastore, raise the limit (`dagster instance concurrency set spark N`).
SPARK_POOL = "spark"

# Replicas follow new changelog data (dbt follows them through `dbt_follow_sensor`).
# `eager()` also waits for every upstream partition to exist, and a topic-partition
# nobody wrote yet (say, the schema change topic) would hold the replicas back forever,
# so that part is left out.
FOLLOW_UPSTREAM = dg.AutomationCondition.eager().without(
    ~dg.AutomationCondition.any_deps_missing()
)
