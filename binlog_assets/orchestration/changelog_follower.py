"""Kafka partitions followed as records arrive: one changelog follower run at a time.

With `dagster.changelog_follow_seconds` above 0, the lag sensor launches no runs. One
`follow_changelog_job` run instead measures the lag of every known partition each
`changelog_poll_seconds` and gives each due partition a bounded run up to the end offset
it saw: the checkpoints, commit points, fence and metadata of any consumer run, without a
run launch and a code-location load per batch. Each partition that read records is that
changelog partition's materialization at once. `changelog_follower_sensor` starts the
next run when one ends. Partitions that another consumer run holds (a launch from the
launchpad) are left to it, and a changelog backfill gets every partition: the follower
ends, and the sensor waits until the backfill is done.
"""

import time
from collections.abc import Callable, Iterator, Sequence

import dagster as dg
from pydantic import Field

from binlog_assets.consume import lag, preflight
from binlog_assets.consume.lag import PartitionLag, Unreachable, waited_for_kafka
from binlog_assets.lakehouse.changelog import (
    ChangelogWriter,
    changelog_uri,
)
from binlog_assets.orchestration.changelog_reports import report_round
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.orchestration.lost_runs import unfinished_runs
from binlog_assets.orchestration.metadata_checkpoint import latest_metadata_checkpoints
from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME, partition_key
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.sensors import (
    changelog_backfill_in_progress,
    held_partitions,
)
from binlog_assets.orchestration.shared import (
    CHANGELOG_FOLLOW_JOB_NAME,
    EVERY_DAEMON_PASS,
    FOLLOW_RETRY_SECONDS,
    FOLLOW_RUN_SECONDS,
    UNFINISHED,
)
from binlog_assets.orchestration.table_metadata import delta_row_count
from binlog_assets.rounds.partition import PartitionOutcome
from binlog_assets.rounds.plan import RunReport
from binlog_assets.rounds.report import RoundReport
from binlog_assets.rounds.round import RoundOptions, consume_round

# A partition whose bounded run failed (a broker away, a stopped partition) is tried
# again after FOLLOW_RETRY_SECONDS, not at every poll: each attempt logs its error.
# The changelog's row count is read from its whole Delta log (every file's statistics):
# a follower does that at most this often, not at every round.
ROW_COUNT_SECONDS = 30.0


class ChangelogFollowConfig(dg.Config):
    seconds: float | None = Field(None, gt=0, description="how long this run follows the "
                                  "partitions (default: dagster.changelog_follow_seconds)")


class DueRule:
    """The lag sensor's rule for a partition's turn: its lag reached `threshold`
    records, or it has lagged for `staleness` seconds."""

    def __init__(self, threshold: int, staleness: float) -> None:
        self.threshold, self.staleness = max(1, threshold), staleness
        self.lagging_since: dict[str, float] = {}

    def due(self, lags: dict[str, int], now: float) -> list[str]:
        self.lagging_since = {k: self.lagging_since.get(k, now)
                              for k, lag in lags.items() if lag > 0}
        return [k for k, lag in lags.items() if lag > 0 and (
            lag >= self.threshold or now - self.lagging_since[k] >= self.staleness)]


class RowCount:
    """The changelog's row count for each round's metadata: counted (`count`) at most
    every `every` seconds; in between, the last count plus the rows this run's rounds
    appended (rows other runs append show at the next count)."""

    def __init__(self, count: Callable[[], int | None], every: float = ROW_COUNT_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.count, self.every, self.clock = count, every, clock
        self.rows: int | None = None
        self.counted_at: float | None = None

    def after(self, outcomes: Sequence[PartitionOutcome]) -> int | None:
        """The count after a round with these `outcomes`."""
        now = self.clock()
        if self.counted_at is None or self.rows is None or now - self.counted_at >= self.every:
            self.rows, self.counted_at = self.count(), now
        else:
            self.rows += sum(o.sink.rows for o in outcomes if o.sink is not None)
        return self.rows


class KeptGauge:
    """A follower round's gauge: the lags at the end through the follower's consumer kept
    open (every source at once, a long wait logged), the row count from `RowCount`."""

    def __init__(self, measure: Callable[[], list[PartitionLag]], rows: RowCount) -> None:
        self.measure, self.row_count = measure, rows

    def lags(self, run: RunReport) -> list[PartitionLag]:
        return self.measure()

    def rows(self, run: RunReport, outcomes: Sequence[PartitionOutcome]) -> int | None:
        return self.row_count.after(outcomes)


def follow_partitions(due: Callable[[], Sequence[str]],
                      consume: Callable[[list[str]], list[PartitionOutcome]], *,
                      poll: float, stop: Callable[[], bool],
                      retry: float = FOLLOW_RETRY_SECONDS,
                      clock: Callable[[], float] = time.monotonic
                      ) -> Iterator[list[PartitionOutcome]]:
    """Bounded runs of the partitions `due()` names, until `stop()` says so; yields each
    round's outcomes. A round that consumed goes straight on to the next (a backlog is
    read without pauses); an idle one waits `poll` seconds. A failed partition rests
    `retry` seconds before its next attempt."""
    resting: dict[str, float] = {}  # partition -> when it may be tried again
    while not stop():
        now = clock()
        keys = [k for k in due() if resting.get(k, 0.0) <= now]
        if keys:
            outcomes = consume(keys)
            for outcome in outcomes:
                if outcome.error is not None:
                    resting[outcome.key] = clock() + retry
                else:
                    resting.pop(outcome.key, None)
            yield outcomes
        else:
            time.sleep(poll)


class ChangelogFollower:
    """One follower run's rounds: which partitions are due (`due`), their bounded runs
    and reports (`consume`), and when to stop (`stop`). One consumer asks for the offsets
    of every round and one changelog writer serves every round: a new one each poll would
    cost a connection and its threads, or a table opened anew."""

    def __init__(self, context: dg.OpExecutionContext, binlake: BinlakeResource,
                 seconds: float) -> None:
        self.context, self.instance = context, context.instance
        self.pipeline = pipeline = binlake.pipeline
        self.deadline = time.monotonic() + seconds
        self.kafka_conf, self.group = binlake.kafka_conf(), binlake.group_id()
        self.topics = [t for s in pipeline.sources for t in s.topics]
        self.rule = DueRule(pipeline.dagster.lag_threshold,
                            pipeline.dagster.max_staleness_seconds)
        self.lags: dict[str, int] = {}  # each partition's lag at the start of the round
        self.row_count = RowCount(lambda: delta_row_count(changelog_uri(pipeline)))
        self.writer = ChangelogWriter(pipeline)
        preflight.check_cluster(self.kafka_conf)
        self.unreachable = Unreachable()
        self.offsets = lag.lag_consumer(self.kafka_conf, self.group, error_cb=self.unreachable)
        self.gauge = KeptGauge(self.measure, self.row_count)

    def close(self) -> None:
        self.offsets.close()

    def stop(self) -> bool:
        if time.monotonic() >= self.deadline:
            return True
        backfill = changelog_backfill_in_progress(self.instance)
        if backfill is not None:
            self.context.log.info(f"backfill {backfill} of the changelog runs: handing the "
                                  f"partitions over to it")
            return True
        return False

    def measure(self) -> list[PartitionLag]:
        # A broker restarting or frozen holds this call (librdkafka waits for it up to
        # its timeouts) and the follower with it: a long wait is logged, not silent.
        began, answered = time.monotonic(), False
        try:
            lags = lag.measure_lag(self.kafka_conf, self.group, self.topics, check=False,
                                   consumer=self.offsets)
            answered = True
            return lags
        finally:
            what = f"the lag measurement of {len(self.topics)} topics"
            line = waited_for_kafka(self.kafka_conf, what, time.monotonic() - began,
                                    answered=answered)
            if line is not None:
                self.unreachable.errors.clear()  # this line names the wait already
                self.context.log.warning(line)
            else:
                self.warn_unreachable(what, time.monotonic() - began)

    def due(self) -> list[str]:
        known = self.instance.get_dynamic_partitions(KAFKA_PARTITIONS_NAME)
        held = held_partitions(self.instance, known)
        self.lags = {partition_key(pl.topic, pl.partition): pl.lag for pl in self.measure()}
        lags = {k: self.lags[k] for k in known if k in self.lags}
        return [k for k in self.rule.due(lags, time.time()) if k not in held]

    def report(self, report: RoundReport) -> None:
        report_round(self.context, report, final=False, one_line=True)

    def warn_unreachable(self, what: str, seconds: float) -> None:
        # The lag consumer's connection errors (a broker restarting closes its
        # connections and refuses new ones) are served by a poll; the round or the
        # measurement that saw them waited for the broker, however it ended.
        self.offsets.poll(0)
        line = self.unreachable.warning(self.kafka_conf, what, seconds)
        if line is not None:
            self.context.log.warning(line)

    def consume(self, keys: list[str]) -> list[PartitionOutcome]:
        began = time.monotonic()
        report = consume_round(
            self.pipeline, self.kafka_conf, keys, ChangelogRunConfig(), group=self.group,
            options=RoundOptions(
                # Every partition's latest materialization at once, not a query each.
                metadata_checkpoint=latest_metadata_checkpoints(self.instance, keys).get,
                # due() has just measured them: the worker processes' rule needs no other.
                lags={k: self.lags.get(k, 0) for k in keys},
                # One changelog commit and one Kafka commit for the round's partitions.
                together=True, writer=self.writer, gauge=self.gauge,
                # Terminated mid-round: what its partitions committed is still recorded.
                on_interrupt=self.report))
        self.report(report)
        self.warn_unreachable(f"a round of {len(keys)} partitions", time.monotonic() - began)
        return report.outcomes


def note_failures(log: dg.DagsterLogManager, outcomes: Sequence[PartitionOutcome],
                  failing: dict[str, BaseException]) -> None:
    """Keep `failing` to the partitions whose last attempt failed, each logged."""
    for outcome in outcomes:
        if outcome.error is None:
            failing.pop(outcome.key, None)
        else:
            failing[outcome.key] = outcome.error
            log.warning(f"{outcome.key}: tried again in {FOLLOW_RETRY_SECONDS:.0f} s; the "
                        f"other partitions go on")


def raise_failures(failing: dict[str, BaseException]) -> None:
    if failing:
        first = next(iter(failing.values()))
        raise RuntimeError(
            f"{len(failing)} partitions failed their last attempt: "
            + "; ".join(f"{key}: {error}" for key, error in sorted(failing.items()))
        ) from first


@dg.op(name="follow_changelog", out={},
       description="Consume every partition's new records into the changelog as they arrive.")
def follow_changelog(context: dg.OpExecutionContext, config: ChangelogFollowConfig,
                     binlake: BinlakeResource) -> Iterator[dg.DagsterEvent]:
    dagster = binlake.pipeline.dagster
    follower = ChangelogFollower(
        context, binlake, config.seconds or dagster.changelog_follow_seconds or FOLLOW_RUN_SECONDS)
    failing: dict[str, BaseException] = {}
    try:
        for outcomes in follow_partitions(follower.due, follower.consume, stop=follower.stop,
                                          poll=dagster.changelog_poll_seconds):
            note_failures(context.log, outcomes, failing)
            # The round's materializations are in the event log since it logged them;
            # the op keeps each one until it yields, so it yields them every round.
            yield from context.consume_events()
    finally:
        follower.close()
    raise_failures(failing)


@dg.job(name=CHANGELOG_FOLLOW_JOB_NAME, executor_def=dg.in_process_executor,
        description="Consume Kafka's new records into the changelog as they arrive, for a "
                    "while (dagster.changelog_follow_seconds).")
def follow_changelog_job() -> None:
    follow_changelog()


@dg.sensor(
    name="changelog_follower_sensor",
    job=follow_changelog_job,
    minimum_interval_seconds=EVERY_DAEMON_PASS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Keeps one changelog follower run going when "
                "dagster.changelog_follow_seconds > 0.",
)
def changelog_follower_sensor(context: dg.SensorEvaluationContext, binlake: BinlakeResource
                              ) -> dg.RunRequest | dg.SkipReason:
    if not binlake.pipeline.dagster.changelog_follow_seconds:
        return dg.SkipReason("dagster.changelog_follow_seconds is 0: kafka_lag_sensor "
                             "launches bounded consumer runs")
    backfill = changelog_backfill_in_progress(context.instance)
    if backfill is not None:
        return dg.SkipReason(f"backfill {backfill} of the changelog holds the partitions")
    if unfinished_runs(context.instance, CHANGELOG_FOLLOW_JOB_NAME, UNFINISHED):
        return dg.SkipReason("a changelog follower run is queued or running")
    return dg.RunRequest()
