"""Replicas that follow the changelog as it lands: a follower run per replica build slot.

With `dagster.replica_follow_seconds` above 0, replicas are not built by automation
after each consumer run (a tick, a queue, a new process, a Spark session: 10-15 s before
the first row moved). One `follow_replicas_job` run instead keeps its Spark sessions and
applies every new changelog version within `replica_poll_seconds` of its commit, for
`replica_follow_seconds`; `replica_follower_sensor` starts the next one. A new version
is applied to the replicas whose source tables it holds rows of (the surveys its commits
carry say which, without reading it), `spark.parallel_replicas` at a time. Each apply that
changed a replica is reported as that replica's materialization at once, and its
`row_count_matches_changelog` check follows within `check_seconds` (the changelog's side
counted by delta-rs from the versions added since the replica's last check), as does its
`source_delay` check (at once when its outcome changes). Its
materializations carry data versions and provenance, so the asset graph shows a replica
Unsynced only while its tables have changes it has not applied (`replica_versions.py`).

The follower holds the `spark` pool's slot, as a replica build does, so replica builds
never overlap; it hands the slot over early when another run waits for it (a rebuild
from the launchpad, or dbt on an embedded catalog).
"""

import queue
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, TypeVar

import dagster as dg
from pydantic import Field

from binlog_assets.orchestration.lost_runs import unfinished_runs
from binlog_assets.orchestration.replica_reports import (
    counted_rows,
    failure_line,
    replica_key,
    replica_metadata,
    replica_names,
    replica_table_metadata,
    replicas_failed,
    row_count_check,
    source_delay_check,
)
from binlog_assets.orchestration.replica_versions import InSync
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import (
    EVERY_DAEMON_PASS,
    FOLLOW_RETRY_SECONDS,
    FOLLOW_RUN_SECONDS,
    SPARK_POOL,
    UNFINISHED,
)

if TYPE_CHECKING:
    from binlog_assets.config import PipelineConfig
    from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
    from binlog_assets.lakehouse.replica.plan import ReplicaResult

FOLLOW_JOB_NAME = "follow_replicas_job"
T = TypeVar("T")

# An untouched replica is still applied once this many versions passed since its last
# apply: the apply then commits its applied version, which keeps its next range short.
STALE_VERSIONS = 1000
# A replica whose apply failed (Spark Connect restarting, a table locked) is applied
# again after this long, not at every poll: each failure logs an error.


# A changed replica's row-count check runs at most this often per replica (a count of
# its `_current` view is a Spark job): the UI shows it within this of each apply.
CHECK_SECONDS = 30.0
# How long the graph may show a current replica Unsynced after the changelog moved for
# other tables: each "in sync" report is an event in the replica's history.
SYNC_SECONDS = 30.0
# The share of a follower's time its row-count checks may take: a check's count of the
# replica's `_current` view is a Spark job of several applies' cost (bench_row_check.py).
CHECK_SHARE = 0.25


class FollowConfig(dg.Config):
    seconds: float | None = Field(None, gt=0, description="how long this run follows the "
                                  "changelog (default: dagster.replica_follow_seconds)")
    check_seconds: float = Field(CHECK_SECONDS, ge=0, description="a changed replica's "
                                 "row-count check runs at most this often, and its source "
                                 "delay check is reported at most this often while its "
                                 "outcome stays the same")
    sync_seconds: float = Field(SYNC_SECONDS, ge=0, description="a replica current while "
                                "the changelog moved for other tables is reported in sync "
                                "at most this often (replica_versions.py)")


@dataclass(frozen=True)
class ChangelogView:
    """What `follow` reads of the changelog: its current `version()`, and
    `touched(after, up_to)`, the replicas that versions (after, up_to] hold rows of
    (None: any may be)."""

    version: Callable[[], int]
    touched: Callable[[int, int], set[str] | None] = lambda after, up_to: None


@dataclass(frozen=True)
class FollowOptions:
    """How `follow` paces its applies: a look at the changelog every `poll` seconds,
    `workers` applies at once, a replica applied once `stale` versions passed since its
    last apply, and again `retry` seconds after a failed one; with `rounds`, (None,
    version) is yielded at every poll."""

    poll: float
    workers: int = 1
    stale: int = STALE_VERSIONS
    retry: float = FOLLOW_RETRY_SECONDS
    rounds: bool = False


class Poll(NamedTuple):
    """A poll of `follow`'s: the changelog's version, and the replicas whose applies
    were still running then (not yet applied up to it)."""

    version: int
    busy: frozenset[str] = frozenset()


def follow(apply: Callable[[str, int], object], names: list[str], *, changelog: ChangelogView,
           options: FollowOptions, stop: Callable[[], bool],
           waiting: Callable[[], None] | None = None) -> Iterator[tuple[str | None, object]]:
    """Apply each new changelog version to the replicas it touches until `stop()` says
    so; yields (replica, result) for every apply, as each ends, and with `rounds`
    (None, `Poll`) at every poll, so the caller can report between applies.

    The first poll applies every replica (whatever is pending); later polls apply those
    that `changelog.touched(seen, current)` names (None: all), and any not applied for
    `stale` versions, `workers` at a time (`options`). With more than one worker a long
    apply holds one of them only: the next polls go on applying the other replicas, and
    a replica touched while its apply runs is applied again once it ends. A replica
    whose apply fails is yielded with its error and rests `retry` seconds, then is
    applied again (at the version then current, new or not): the others go on
    following meanwhile. While applies run, `waiting()` is called every `poll` seconds
    none of them ends (the caller reports on the calls they wait for). Once `stop()`
    holds, the applies running end and no more start.
    """
    poll, stale = options.poll, options.stale
    seen = None
    brought: dict[str, int] = {}  # replica -> the version its last apply went up to
    resting: dict[str, float] = {}  # replica whose last apply failed -> when to try again
    owed: set[str] = set()  # replicas touched since their last apply began
    applies = _Applies(apply, options.workers, waiting)
    try:
        while True:
            current = changelog.version()
            if current != seen:
                hit = None if seen is None else changelog.touched(seen, current)
                owed.update(n for n in names if n not in resting and (
                    hit is None or n in hit or current - brought.get(n, -1) >= stale))
                seen = current
            now, busy = time.monotonic(), applies.busy()
            due = [n for n, at in resting.items() if at <= now and n not in busy]
            due += [n for n in names if n in owed and n not in busy and n not in due]
            owed.difference_update(due)
            for name, version, result in applies.start(due, current, poll):
                if isinstance(result, Exception):
                    resting[name] = time.monotonic() + options.retry
                else:
                    resting.pop(name, None)
                    brought[name] = version
                yield name, result
            if options.rounds:
                # Touched but not applied up to it yet: running, or to start next poll.
                yield None, Poll(current, frozenset(applies.busy() | owed))
            if stop():
                break
            if not applies.busy():
                time.sleep(poll)
        for name, _version, result in applies.drain(poll):
            yield name, result
    except BaseException:
        # Terminated (SIGINT) or closed: start no more applies, and wait for none (the
        # caller cancels the running ones' Spark jobs).
        applies.close(wait=False)
        raise
    applies.close(wait=True)


class _Applies:
    """`follow`'s applies: in turn on the caller's thread with one worker and no
    `waiting`, else on a pool of `workers` threads, each apply's result taken as it
    ends."""

    def __init__(self, apply: Callable[[str, int], object], workers: int,
                 waiting: Callable[[], None] | None) -> None:
        self.apply, self.waiting = apply, waiting
        self.pool = (ThreadPoolExecutor(workers, thread_name_prefix="follow")
                     if workers > 1 or waiting is not None else None)
        self.running: dict[Future, tuple[str, int, int]] = {}  # -> name, version, order
        self.started = 0

    def busy(self) -> set[str]:
        return {name for name, _, _ in self.running.values()}

    def start(self, names: list[str], version: int, every: float
              ) -> Iterator[tuple[str, int, object]]:
        """Starts an apply of each of `names` up to `version`; yields (name, version,
        result or the exception it raised) of those that end within `every` seconds
        (of all of them, in order, without a pool)."""
        if self.pool is None:
            for name in names:
                yield name, version, self._one(name, version)
            return
        for name in names:
            self.running[self.pool.submit(self._one, name, version)] = (
                name, version, self.started)
            self.started += 1
        if self.running:
            yield from self._ended(every)

    def drain(self, every: float) -> Iterator[tuple[str, int, object]]:
        while self.running:  # no poll to come back to: wait for `waiting` alone
            yield from self._ended(every if self.waiting is not None else None)

    def close(self, *, wait: bool) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=wait, cancel_futures=not wait)

    def _one(self, name: str, version: int) -> object:
        try:
            return self.apply(name, version)
        except Exception as exc:  # the run reports it at its end
            return exc

    def _ended(self, every: float | None) -> Iterator[tuple[str, int, object]]:
        done, _ = wait(self.running, timeout=every, return_when=FIRST_COMPLETED)
        if not done and self.waiting is not None:
            self.waiting()
        for future in sorted(done, key=lambda f: self.running[f][2]):
            name, version, _ = self.running.pop(future)
            yield name, version, future.result()


def changed(result: "ReplicaResult") -> bool:
    """Whether an apply changed the replica (rows, schema, truncates, purged tombstones)."""
    return bool(result.rows or result.schema_changes or result.truncated
                or result.tombstones)


def pool_wanted(instance: dg.DagsterInstance, own_run_id: str) -> bool:
    """Whether another run waits for the `spark` pool: a step waiting for a slot, or a
    queued run whose first steps need one (the queue holds those back)."""
    info = instance.event_log_storage.get_concurrency_info(SPARK_POOL)
    if info.pending_run_ids - {own_run_id}:
        return True
    queued = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED]))
    return any(run.run_op_concurrency is not None
               and SPARK_POOL in run.run_op_concurrency.root_key_counts
               for run in queued if run.run_id != own_run_id)


class ReplicaFollower:
    """One follower run's replicas: each applied as the changelog lands (`apply`, by a
    builder per replica applied at once, as a replica build has), its materialization
    and checks reported (`take`), and the run's end (`finish`)."""

    def __init__(self, context: dg.OpExecutionContext, config: FollowConfig,
                 binlake: BinlakeResource) -> None:
        # Spark and the replica modules load with the first follower, not the location.
        from binlog_assets.lakehouse.changelog_reader import SourceClock
        from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
        from binlog_assets.lakehouse.replica.routes import replica_routes
        from binlog_assets.lakehouse.spark import session_lost

        self.context = context
        self.pipeline = pipeline = binlake.pipeline
        seconds = config.seconds or pipeline.dagster.replica_follow_seconds or FOLLOW_RUN_SECONDS
        self.deadline = time.monotonic() + seconds
        self.names = replica_names(pipeline)
        self.builders = Builders(lambda: ReplicaBuilder(binlake.spark(), pipeline),
                                 max(1, min(len(self.names), pipeline.spark.parallel_replicas)),
                                 session_lost)
        self.routes = {name: route for name, route in replica_routes(pipeline).items()
                       if name in self.names}
        self.failed: dict[str, Exception] = {}  # replica -> its last apply's error
        self.held: set[str] = set()  # replicas a load appends to: not in sync meanwhile
        self.checks = _Checks(config.check_seconds, _row_count_evaluator(self.builders,
                                                                         pipeline))
        self.delays = _Delays(config.check_seconds)
        self.sync = InSync(context.instance, config.sync_seconds)
        self.clock = SourceClock(pipeline)
        self.source_of = {t.replica: s.name for s in pipeline.sources for t in s.tables}
        # A round's applies in one log line at its end: each line is an event write on
        # this thread, ahead of the next replica's materialization.
        self.applied: list[str] = []

    def follow(self) -> Iterator[tuple[str | None, object]]:
        from binlog_assets.lakehouse.changelog_reader import changelog_version
        from binlog_assets.lakehouse.replica.plan import replicas_touched

        pipeline = self.pipeline
        changelog = ChangelogView(
            lambda: changelog_version(None, pipeline),
            lambda after, up_to: replicas_touched(pipeline, self.routes, after, up_to))
        return follow(self.apply, self.names, changelog=changelog,
                      options=FollowOptions(poll=pipeline.dagster.replica_poll_seconds,
                                            workers=len(self.builders.all), rounds=True),
                      stop=self.stop, waiting=self.log_waits)

    def stop(self) -> bool:
        if time.monotonic() >= self.deadline:
            return True
        if pool_wanted(self.context.instance, self.context.run_id):
            self.context.log.info("another run waits for the spark pool: handing it over")
            return True
        return False

    def apply(self, name: str, version: int) -> tuple:
        from binlog_assets.lakehouse.delta_log import log_scope

        def with_builder(builder: "ReplicaBuilder") -> tuple:
            # One log scope for the apply and the columns read after it: the replica's
            # log, opened by the apply, is brought up to date instead of opened again.
            with log_scope():
                result = builder.apply(name, up_to_version=version)
                # The table's columns as this apply left them, read before another can
                # change them.
                columns = replica_table_metadata(builder, name) if changed(result) else {}
            return result, columns

        return self.builders.run(with_builder, f"replica {name}")

    def log_waits(self) -> None:
        from binlog_assets.lakehouse.spark_waits import SPARK_WAITS

        for line in SPARK_WAITS.lines():
            self.context.log.warning(line)

    def log_applied(self) -> None:
        if self.applied:
            self.context.log.info("\n".join(self.applied))
            self.applied.clear()
        for line in self.builders.renewed():
            self.context.log.warning(line)
        self.log_waits()

    def take(self, name: str | None, outcome: object) -> Iterator:
        """What one of `follow`'s outcomes reports: a poll (`name` None, every replica
        applied up to `outcome.version` but the failed and the busy), a failed apply, or
        an applied one."""
        if name is None:
            yield from self._polled(outcome)
        elif isinstance(outcome, Exception):
            self.failed[name] = outcome
            self.context.log.error(f"replica {name}: {type(outcome).__name__}: "
                                   f"{failure_line(outcome)}; tried again in "
                                   f"{FOLLOW_RETRY_SECONDS:.0f} s, the others go on following")
        else:
            self.failed.pop(name, None)
            result, columns = outcome
            if result.held:
                self.held.add(name)
            else:
                self.held.discard(name)
            if changed(result):
                yield from self._applied(name, result, columns)

    def _polled(self, poll: Poll) -> Iterator:
        self.log_applied()
        yield from self.delays.due(time.monotonic())
        yield from self.checks.due(time.monotonic())
        broken = set(self.failed) | poll.busy | self.held
        version = poll.version
        times = self.clock.advance(version)
        yield from self.sync.due([n for n in self.names if n not in broken], version,
                                 time.monotonic(),
                                 lambda name: times.get(self.source_of.get(name, "")))

    def _applied(self, name: str, result: "ReplicaResult", columns: dict) -> Iterator:
        self.checks.applied(name, result.key_rule, result.applied_version)
        self.applied.append(f"replica {name}: {result}")
        if result.warning:
            self.context.log.warning(result.warning)
        metadata = replica_metadata(result, None) | columns
        tags, _ = self.sync.applied(name, result.applied_version, time.monotonic(), metadata)
        yield dg.AssetMaterialization(asset_key=replica_key(name), metadata=metadata,
                                      tags=tags)
        # Evaluated at each apply, so the UI shows it minutes before the run ends.
        delay = source_delay_check(replica_key(name), result,
                                   self.pipeline.dagster.replica_delay_alert_seconds,
                                   time.time())
        yield from self.delays.applied(name, dg.AssetCheckEvaluation(
            asset_key=delay.asset_key, check_name=delay.check_name,
            passed=delay.passed, severity=delay.severity, metadata=delay.metadata,
            description=delay.description), time.monotonic())
        # Only this one: another's apply of this round may be in flight.
        yield from self.checks.due(time.monotonic(), only=name)

    def interrupt(self) -> None:
        # Terminated: the applies in progress have their Spark jobs cancelled; each is one
        # Delta commit, so a replica is applied or as it was.
        for builder in self.builders.all:
            builder.spark.interruptAll()

    def finish(self) -> Iterator:
        self.log_applied()
        # Whatever is still due: every changed replica's last apply is checked.
        yield from self.delays.due(None)
        yield from self.checks.due(None)
        if self.failed:
            raise replicas_failed(list(self.failed.items()), len(self.names))


@dg.op(name="follow_replicas", pool=SPARK_POOL, out={},
       description="Apply each new changelog version to the replicas as it lands.")
def follow_replicas(context: dg.OpExecutionContext, config: FollowConfig,
                    binlake: BinlakeResource) -> Iterator:
    follower = ReplicaFollower(context, config, binlake)
    followed = follower.follow()
    try:
        for name, outcome in followed:
            yield from follower.take(name, outcome)
    except BaseException:
        followed.close()
        follower.interrupt()
        raise
    yield from follower.finish()


class _Delays:
    """The `source_delay` checks of the replicas a follower changed: an apply's
    evaluation is reported at once when its outcome differs from the replica's last one
    reported (an alert, or its end), else at most every `every` seconds per replica, the
    latest kept until then and reported by the run's end: at a hundred busy replicas an
    event write per apply was a fifth of a round."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.pending: dict[str, dg.AssetCheckEvaluation] = {}
        self.last: dict[str, tuple[float, bool]] = {}  # replica -> (reported at, passed)

    def applied(self, name: str, evaluation: dg.AssetCheckEvaluation, now: float
                ) -> Iterator[dg.AssetCheckEvaluation]:
        last = self.last.get(name)
        if last is None or last[1] != evaluation.passed or now - last[0] >= self.every:
            self.pending.pop(name, None)
            self.last[name] = (now, evaluation.passed)
            yield evaluation
        else:
            self.pending[name] = evaluation

    def due(self, now: float | None) -> Iterator[dg.AssetCheckEvaluation]:
        """The kept evaluations whose time came (all of them with `now` None)."""
        for name, evaluation in sorted(self.pending.items()):
            if now is None or now - self.last[name][0] >= self.every:
                del self.pending[name]
                self.last[name] = (now if now is not None else time.monotonic(),
                                   evaluation.passed)
                yield evaluation


class _Checks:
    """The row-count checks of the replicas a follower changed: each replica's last apply
    is checked, at most every `every` seconds per replica, and the checks take at most
    `share` of the follower's time (after one that took c seconds, the next waits
    c * (1/share - 1)), so that with many busy replicas they delay the checks, not the
    applies. `evaluate(name, key rule, version)` gives one check's evaluation."""

    def __init__(self, every: float, evaluate: Callable[[str, str | None, int], object], *,
                 share: float = CHECK_SHARE, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.every, self.evaluate, self.share, self.clock = every, evaluate, share, clock
        self.pending: dict[str, tuple[str | None, int]] = {}  # replica -> (rule, version)
        self.last: dict[str, float] = {}  # replica -> when it was last checked
        self.resume_at = float("-inf")

    def applied(self, name: str, rule: str | None, version: int) -> None:
        self.pending[name] = (rule, version)

    def due(self, now: float | None, only: str | None = None) -> Iterator:
        """The evaluation of the next pending check whose time came, of `only` when given
        (all of them with `now` None: the run's end). Called when no apply of theirs is
        in flight: each replica's table is then at its pending version."""
        if now is not None and now < self.resume_at:
            return
        for name, (rule, version) in sorted(self.pending.items()):
            if only is not None and name != only:
                continue
            if now is not None and now - self.last.get(name, -self.every) < self.every:
                continue
            del self.pending[name]
            began = self.clock()
            evaluation = self.evaluate(name, rule, version)
            ended = self.clock()
            self.last[name] = ended
            yield evaluation
            if now is not None:
                self.resume_at = ended + (ended - began) * (1 / self.share - 1)
                return


class Builders:
    """The follower's replica builders, one per replica applied at once. A builder whose
    Spark Connect session is lost (its server restarted: the client closes the session,
    and each later call on it fails) is replaced by one with a new session, and the call
    that found it lost is tried once more on it."""

    def __init__(self, make: Callable[[], "ReplicaBuilder"], count: int,
                 lost: Callable[[object], bool]) -> None:
        self.make, self.lost = make, lost
        self.all = [make() for _ in range(count)]
        self.free: queue.SimpleQueue = queue.SimpleQueue()
        for builder in self.all:
            self.free.put(builder)
        self._renewed: queue.SimpleQueue = queue.SimpleQueue()  # lines for the run's log

    def run(self, call: Callable[["ReplicaBuilder"], T], what: str) -> T:
        """`call` on a free builder (waiting for one)."""
        builder = self.free.get()
        try:
            try:
                return call(builder)
            except Exception as exc:
                if not self.lost(builder.spark):
                    raise
                fresh = self.make()
                self.all[self.all.index(builder)] = builder = fresh
                self._renewed.put(f"{what}: the Spark session stopped answering "
                                  f"({type(exc).__name__}: {failure_line(exc)}); tried "
                                  f"again on a new session")
                return call(builder)
        finally:
            self.free.put(builder)

    def renewed(self) -> list[str]:
        """A line for each builder renewed since the last call."""
        lines = []
        while not self._renewed.empty():
            lines.append(self._renewed.get())
        return lines


def _row_count_evaluator(builders: Builders, pipeline: "PipelineConfig"
                         ) -> Callable[[str, str | None, int], object]:
    """`row_count_matches_changelog` of a replica at a version, its changelog side
    counted by a `LiveKeys` kept per replica (only the versions added since its last)."""
    from binlog_assets.lakehouse.audit_arrow import LiveKeys
    from binlog_assets.lakehouse.replica.plan import APPEND_ONLY

    counters: dict[str, LiveKeys] = {}

    def evaluate(name: str, rule: str | None, version: int) -> dg.AssetCheckEvaluation:
        counter = counters.get(name)
        if counter is None or counter.append_only != (rule == APPEND_ONLY):
            counter = counters[name] = LiveKeys(pipeline, name,
                                                append_only=rule == APPEND_ONLY)

        def check(builder: "ReplicaBuilder") -> object:
            return row_count_check(builder, name, rule, counted_rows(builder, name, rule),
                                   version, counter)

        result = builders.run(check, f"the row-count check of replica {name}")
        return dg.AssetCheckEvaluation(
            asset_key=result.asset_key, check_name=result.check_name, passed=result.passed,
            metadata=result.metadata, description=result.description)

    return evaluate


@dg.job(name=FOLLOW_JOB_NAME, executor_def=dg.in_process_executor,
        description="Replicas follow the changelog for a while (dagster.replica_follow_seconds).")
def follow_replicas_job() -> None:
    follow_replicas()


@dg.sensor(
    name="replica_follower_sensor",
    job=follow_replicas_job,
    minimum_interval_seconds=EVERY_DAEMON_PASS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Keeps one follower run going when dagster.replica_follow_seconds > 0.",
)
def replica_follower_sensor(context: dg.SensorEvaluationContext, binlake: BinlakeResource
                            ) -> dg.RunRequest | dg.SkipReason:
    if not binlake.pipeline.dagster.replica_follow_seconds:
        return dg.SkipReason("dagster.replica_follow_seconds is 0: automation builds the "
                             "replicas after each consumer run")
    if unfinished_runs(context.instance, FOLLOW_JOB_NAME, UNFINISHED):
        return dg.SkipReason("a follower run is queued or running")
    return dg.RunRequest()
