"""The follower run: replicas that apply each changelog version as it lands.

A real `follow_replicas_job` run (in process, the session's Spark) follows a changelog
that a thread keeps writing to: every commit is applied and reported as a materialization
of the replica it changed while the run goes on, the untouched replica is not reported,
and each apply's row-count check reaches the instance while the run goes on. The loop,
the sensor and the pool hand-over are tested on their own below.
"""

from __future__ import annotations

import subprocess
import threading
import time

import dagster as dg
import pytest
import yaml
from lake_events import Partition, Source, follower_beside, row

from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.lakehouse.changelog_reader import changelog_version
from binlog_assets.lakehouse.replica.plan import replicas_touched
from binlog_assets.lakehouse.replica.routes import replica_routes
from binlog_assets.orchestration.replica_follower import (
    FOLLOW_JOB_NAME,
    Builders,
    ChangelogView,
    FollowOptions,
    _Checks,
    _Delays,
    follow,
    follow_replicas_job,
    pool_wanted,
    replica_follower_sensor,
)
from binlog_assets.orchestration.replica_reports import (
    ROW_COUNT_CHECK,
    SOURCE_DELAY_CHECK,
    replica_key,
)
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import SPARK_POOL


def test_a_follower_run_applies_each_commit_as_it_lands(spark, make_config, tmp_path) -> None:
    pipeline = make_config([{"source": "shop.orders", "replica": "orders"},
                          {"source": "shop.products", "replica": "products"}],
                         dagster={"replica_poll_seconds": 0.2})
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_none=True)))
    orders, products = Source("shop.orders"), Source("shop.products")
    part = Partition(ChangelogWriter(pipeline))
    part.write(part.records([[orders.insert(row(1))], [products.insert(row(7))]]))
    seen: list[int] = []

    def materialized(instance, name: str) -> int:
        return len(instance.fetch_materializations(replica_key(name), limit=10).records)

    def writer(instance) -> None:
        # Each commit waits for the one before to be reported: only a run that reports
        # while it goes on gets this far. Then a run asks for the pool: the follower ends.
        deadline = time.monotonic() + 240
        for i, wanted in ((2, ("products", 1)), (3, ("orders", 2)), (None, ("orders", 3))):
            while materialized(instance, wanted[0]) < wanted[1]:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.1)
            seen.append(wanted[1])
            if i is not None:
                part.write(part.records([[orders.insert(row(i))]]))
        instance.event_log_storage.claim_concurrency_slot(SPARK_POOL, "rebuild", "replicas")

    with follower_beside(writer, str(path), 300) as (instance, result):
        logged = [e.user_message for e in instance.all_logs(result.run_id)
                  if e.user_message.startswith("replica ")]
    assert result.success
    assert seen == [1, 2, 3]
    # The applies that end within a poll are logged in one line (an event write each):
    # each apply once, the first build's two (in one line or two) before orders' others.
    lines = [sorted(line.split(": ")[0] for line in m.splitlines()) for m in logged]
    assert all(len(set(names)) == len(names) for names in lines), lines
    named = [name for names in lines for name in names]
    assert sorted(named[:2]) == ["replica orders", "replica products"], lines
    assert named[2:] == ["replica orders", "replica orders"], lines

    mats = [e for e in result.all_events if e.is_step_materialization]
    by_replica = [(e.asset_key.path[-1], e.step_materialization_data.materialization.metadata)
                  for e in mats]
    # The first round builds both, side by side (either may report first); then each
    # commit is one more apply of orders alone.
    names = [name for name, _ in by_replica]
    assert sorted(names[:2]) == ["orders", "products"] and names[2:] == ["orders", "orders"]
    versions = [md["applied_changelog_version"].value for name, md in by_replica
                if name == "orders"]
    assert versions == sorted(versions) and len(set(versions)) == 3
    db = pipeline.lakehouse.database
    assert {r["id"] for r in spark.table(f"{db}.orders_current").collect()} == {1, 2, 3}
    evaluations = result.get_asset_check_evaluations()
    checks = {e.asset_key.path[-1]: e for e in evaluations if e.check_name == ROW_COUNT_CHECK}
    assert set(checks) == {"orders", "products"}
    assert all(c.passed for c in checks.values())
    assert checks["orders"].metadata["replica_rows"].value == 3
    # The source delay: these source commits are from 2023, far past the limit, so each
    # warns; reported at each replica's first apply, then, its outcome the same, once
    # more by the run's end for orders' later applies (within check_seconds).
    delays = [e for e in evaluations if e.check_name == SOURCE_DELAY_CHECK]
    assert [e.asset_key.path[-1] for e in delays] == [*names[:2], "orders"]
    assert all(not d.passed and d.severity == dg.AssetCheckSeverity.WARN for d in delays)
    assert all(d.metadata["source_delay_seconds"].value > 900 for d in delays)
    assert all("source_delay_seconds" in md for _, md in by_replica)


def test_a_follower_runs_check_is_seen_before_the_run_ends_and_catches_a_lost_row(
        spark, make_config, tmp_path) -> None:
    pipeline = make_config([{"source": "shop.orders", "replica": "orders"}],
                         dagster={"replica_poll_seconds": 0.2})
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_none=True)))
    orders = Source("shop.orders")
    part = Partition(ChangelogWriter(pipeline))
    part.write(part.records([[orders.insert(row(1))], [orders.insert(row(2))]]))
    check_key = dg.AssetCheckKey(replica_key("orders"), ROW_COUNT_CHECK)
    seen: list[tuple[bool, int, str]] = []  # (passed, replica rows, the run's status)

    def watcher(instance) -> None:
        # What a user's UI reads: the check's latest execution (one per run, which each
        # evaluation of the run updates), while the run goes on.
        deadline, last = time.monotonic() + 240, None
        while len(seen) < 2 and time.monotonic() < deadline:
            latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(
                [check_key]).get(check_key)
            if latest is not None and latest.event is not None and \
                    latest.event.asset_check_evaluation and latest.event.timestamp != last:
                last = latest.event.timestamp
                evaluation = latest.event.asset_check_evaluation
                (run,) = instance.get_runs(limit=1)
                seen.append((evaluation.passed, evaluation.metadata["replica_rows"].value,
                             run.status.value))
                if len(seen) == 1:
                    # A row lost behind binlake's back, then a new change of the table.
                    spark.sql(f"DELETE FROM {pipeline.lakehouse.database}.orders WHERE id = 1")
                    part.write(part.records([[orders.insert(row(3))]]))
            time.sleep(0.1)
        instance.event_log_storage.claim_concurrency_slot(SPARK_POOL, "rebuild", "replicas")

    with dg.instance_for_test() as instance:
        instance.event_log_storage.set_concurrency_slots(SPARK_POOL, 1)
        thread = threading.Thread(target=watcher, args=(instance,))
        thread.start()
        result = follow_replicas_job.execute_in_process(
            instance=instance, resources={"binlake": BinlakeResource(config_path=str(path))},
            run_config={"ops": {"follow_replicas": {"config": {"seconds": 300,
                                                               "check_seconds": 0}}}})
        thread.join()
    assert result.success
    # Each apply's check reached the instance while the run was still going; the second
    # found the replica one row short of the changelog's live keys.
    assert seen == [(True, 2, "STARTED"), (False, 2, "STARTED")]
    (failed,) = [e for e in result.get_asset_check_evaluations()
                 if e.check_name == ROW_COUNT_CHECK and not e.passed]
    assert failed.metadata["changelog_live_keys"].value == 3


def test_checks_wait_their_interval_and_take_a_bounded_share_of_the_time() -> None:
    clock = [0.0]

    def evaluate(name: str, rule, version: int) -> tuple[str, int]:
        clock[0] += 1.0  # each check takes a second
        return name, version

    checks = _Checks(30, evaluate, share=0.25, clock=lambda: clock[0])
    checks.applied("a", None, 1)
    checks.applied("b", None, 1)
    # One check, then the others wait 3 s (checks take a quarter of the time at most).
    assert list(checks.due(clock[0])) == [("a", 1)]
    assert list(checks.due(3.0)) == []
    clock[0] = 4.0
    assert list(checks.due(4.0)) == [("b", 1)]
    # a was checked at 1 s: its next apply is checked 30 s after, not before.
    checks.applied("a", None, 2)
    clock[0] = 20.0
    assert list(checks.due(20.0)) == []
    assert list(checks.due(31.0)) == [("a", 2)]
    # The run's end checks whatever is pending, at once.
    checks.applied("a", None, 3)
    checks.applied("b", None, 3)
    assert list(checks.due(None)) == [("a", 3), ("b", 3)]


def test_a_delay_is_reported_when_its_outcome_changes_else_at_most_every_interval(
        ) -> None:
    def delay(passed: bool, seconds: float) -> dg.AssetCheckEvaluation:
        return dg.AssetCheckEvaluation(
            asset_key=dg.AssetKey(["replica", "a"]), check_name=SOURCE_DELAY_CHECK,
            passed=passed, metadata={"source_delay_seconds": seconds})

    def seconds(evaluations) -> list[float]:
        return [e.metadata["source_delay_seconds"].value for e in evaluations]

    delays = _Delays(30)
    assert seconds(delays.applied("a", delay(True, 1.0), now=0.0)) == [1.0]  # the first
    assert seconds(delays.applied("a", delay(True, 2.0), now=5.0)) == []  # kept
    assert seconds(delays.applied("a", delay(True, 3.0), now=10.0)) == []
    assert seconds(delays.due(20.0)) == []
    assert seconds(delays.due(30.0)) == [3.0]  # the latest, once its interval passed
    assert seconds(delays.due(31.0)) == []
    # An alert is reported at once, and so is its end.
    assert seconds(delays.applied("a", delay(False, 90.0), now=32.0)) == [90.0]
    assert seconds(delays.applied("a", delay(True, 4.0), now=33.0)) == [4.0]
    assert seconds(delays.applied("a", delay(True, 5.0), now=34.0)) == []
    # The run's end reports whatever is kept; with no interval, every apply.
    assert seconds(delays.due(None)) == [5.0]
    every = _Delays(0)
    assert seconds([*every.applied("a", delay(True, 1.0), now=0.0),
                    *every.applied("a", delay(True, 2.0), now=0.0)]) == [1.0, 2.0]


def test_the_loop_applies_every_replica_once_per_new_version() -> None:
    versions = iter([3, 3, 5, 5, 5, 8])
    stops = iter([False] * 5 + [True])
    applied = list(follow(lambda name, v: (name, v), ["a", "b"],
                          changelog=ChangelogView(lambda: next(versions)),
                          options=FollowOptions(poll=0), stop=lambda: next(stops)))
    assert applied == [("a", ("a", 3)), ("b", ("b", 3)), ("a", ("a", 5)), ("b", ("b", 5)),
                       ("a", ("a", 8)), ("b", ("b", 8))]


def test_later_rounds_apply_only_the_touched_replicas_and_the_stale_ones() -> None:
    versions = iter([3, 5, 8, 9, 9])
    stops = iter([False] * 4 + [True])
    asked: list[tuple[int, int]] = []

    def touched(after: int, up_to: int) -> set[str] | None:
        asked.append((after, up_to))
        return {5: {"b"}, 8: set(), 9: None}[up_to]

    applied = list(follow(lambda name, v: v, ["a", "b", "c"],
                          changelog=ChangelogView(lambda: next(versions), touched),
                          options=FollowOptions(poll=0, stale=5), stop=lambda: next(stops)))
    assert asked == [(3, 5), (5, 8), (8, 9)]
    # 3: the first round, all; 5: b; 8: nothing touched, but a and c were last applied at
    # 3 (stale at 5 versions); 9: the surveys could not say, so all.
    assert applied == [("a", 3), ("b", 3), ("c", 3), ("b", 5), ("a", 8), ("c", 8),
                       ("a", 9), ("b", 9), ("c", 9)]


def test_the_loop_applies_workers_replicas_at_once() -> None:
    # Each apply waits until another is in flight with it: only applies that overlap
    # get past the barrier (its timeout is the liveness bound).
    together = threading.Barrier(2, timeout=60)
    stops = iter([True])

    def apply(name: str, version: int) -> tuple[str, int]:
        together.wait()
        return name, version

    applied = list(follow(apply, ["a", "b", "c", "d"], changelog=ChangelogView(lambda: 1),
                          options=FollowOptions(poll=0, workers=2), stop=lambda: next(stops)))
    assert sorted(applied) == [(n, (n, 1)) for n in "abcd"]


def test_a_long_apply_holds_one_worker_while_the_others_follow() -> None:
    """A big table's load had the follower apply its replica for minutes while every
    other replica waited for that round to end (E6 beside a 2M-row load: p95 185 s).
    The long apply holds one worker; the next versions are applied to the others
    meanwhile, and the long one's replica is applied again once it ends."""
    release = threading.Event()
    versions = [1, 2, 3]
    calls: list[tuple[str, int]] = []

    def version() -> int:
        return versions.pop(0) if versions else 4

    def apply(name: str, version: int) -> tuple[str, int]:
        calls.append((name, version))
        if name == "big" and version == 1:
            assert release.wait(10), "the other replica was not applied meanwhile"
        if (name, version) == ("small", 3):
            release.set()
        return name, version

    applied = list(follow(apply, ["big", "small"], changelog=ChangelogView(version),
                          options=FollowOptions(poll=0.01, workers=2),
                          stop=lambda: {("big", 4), ("small", 4)} <= set(calls)))
    results = [r for _, r in applied]
    assert [r for r in results if r[0] == "small"] == [("small", v) for v in (1, 2, 3, 4)]
    # Touched while it ran: applied again once it ended, at the version then current.
    assert [r for r in results if r[0] == "big"] == [("big", 1), ("big", 4)]
    assert results.index(("small", 2)) < results.index(("big", 1))


def test_the_surveys_name_the_replicas_that_new_versions_touch(make_config) -> None:
    pipeline = make_config([{"source": "shop.orders", "replica": "orders"},
                          {"source": "shop.products", "replica": "products"},
                          {"source": "shop.users", "replica": "users"}])
    routes = replica_routes(pipeline)
    orders, products = Source("shop.orders"), Source("shop.products")
    part = Partition(ChangelogWriter(pipeline))
    part.write(part.records([[orders.insert(row(1))], [products.insert(row(1))]]))
    first = changelog_version(None, pipeline)
    part.write(part.records([[orders.insert(row(2))]]))
    second = changelog_version(None, pipeline)
    assert replicas_touched(pipeline, routes, first, second) == {"orders"}
    part.write(part.records([products.update(row(1), row(1, note="x")),
                             [orders.truncate()]]))
    assert replicas_touched(pipeline, routes, second, changelog_version(None, pipeline)
                            ) == {"orders", "products"}
    # A schema change may rename a table into any replica: every replica looks.
    third = changelog_version(None, pipeline)
    part.write(part.records([[products.ddl({**products.types, "extra": "int"})]]))
    assert replicas_touched(pipeline, routes, third, changelog_version(None, pipeline)) is None


def test_a_replica_whose_apply_fails_is_left_and_the_others_go_on() -> None:
    versions = iter([3, 5, 8])
    stops = iter([False, False, True])

    def apply(name: str, version: int) -> tuple[str, int]:
        if name == "a" and version == 3:
            raise ValueError("a is broken")
        return name, version

    applied = list(follow(apply, ["a", "b"], changelog=ChangelogView(lambda: next(versions)),
                          options=FollowOptions(poll=0), stop=lambda: next(stops)))
    assert [name for name, _ in applied] == ["a", "b", "b", "b"]
    assert isinstance(applied[0][1], ValueError)
    assert [result for _, result in applied[1:]] == [("b", 3), ("b", 5), ("b", 8)]


def test_a_replica_whose_apply_failed_is_applied_again_after_its_rest() -> None:
    """A Spark Connect server restarting fails the applies in flight: the replica was
    left until the run ended (minutes behind). It rests `retry` seconds, then is applied
    again at the version then current, though no new version came."""
    versions = iter([3, 3, 3, 5])
    stops = iter([False, False, False, True])
    failures = iter([True])

    def apply(name: str, version: int) -> tuple[str, int]:
        if name == "a" and next(failures, False):
            raise RuntimeError("Cannot call methods on a stopped SparkContext.")
        return name, version

    applied = list(follow(apply, ["a", "b"], changelog=ChangelogView(lambda: next(versions)),
                          options=FollowOptions(poll=0.02, retry=0.03),
                          stop=lambda: next(stops)))
    assert isinstance(applied[0][1], RuntimeError)
    # b at 3; a again at 3 (no new version); then both at 5.
    assert [(n, r) for n, r in applied[1:]] == [("b", ("b", 3)), ("a", ("a", 3)),
                                                ("a", ("a", 5)), ("b", ("b", 5))]


def test_a_round_whose_applies_wait_calls_waiting_until_one_ends() -> None:
    """An apply in a Spark call its server does not answer waits up to ten minutes in the
    client's retries: the run said nothing until the round ended (the soak's Spark
    Connect restart, 4 minutes). `waiting` is called every poll while none ends."""
    release = threading.Event()
    calls: list[float] = []

    def apply(name: str, version: int) -> str:
        if name == "slow":
            release.wait(5)
        return name

    def waiting() -> None:
        calls.append(time.monotonic())
        if len(calls) == 3:
            release.set()

    applied = list(follow(apply, ["slow"], changelog=ChangelogView(lambda: 1),
                          options=FollowOptions(poll=0.02), stop=lambda: True,
                          waiting=waiting))
    assert applied == [("slow", "slow")]
    assert len(calls) == 3, calls


class _Session:
    def __init__(self, n: int) -> None:
        self.n, self.answers = n, True


class _Builder:
    def __init__(self, n: int) -> None:
        self.spark = _Session(n)


def test_a_builder_whose_spark_session_is_lost_is_renewed_and_its_call_tried_again(
        ) -> None:
    """A Spark Connect server restarted under a follower: its client closes the old
    session, and every later call on it failed until the run ended (the soak's Spark
    Connect restart). The builder is replaced by one on a new session, the call retried;
    any other failure is the call's own."""
    made: list[_Builder] = []

    def make() -> _Builder:
        made.append(_Builder(len(made)))
        return made[-1]

    builders = Builders(make, 2, lost=lambda session: not session.answers)
    first, second = made
    first.spark.answers = False
    calls: list[int] = []

    def apply(builder: _Builder) -> int:
        calls.append(builder.spark.n)
        if not builder.spark.answers:
            raise RuntimeError("[NO_ACTIVE_OR_DEFAULT_SESSION] No active or default Spark "
                               "session found.")
        return builder.spark.n

    assert builders.run(apply, "replica a") == 2  # the lost one, then its replacement
    assert calls == [0, 2]
    assert builders.all == [made[2], second]
    (line,) = builders.renewed()
    assert line.startswith("replica a: the Spark session stopped answering "
                           "(RuntimeError: [NO_ACTIVE_OR_DEFAULT_SESSION]")
    assert builders.renewed() == []
    # Both builders are free again: neither the lost nor the new one is held.
    assert sorted(builders.run(apply, "b") for _ in range(4)) == [1, 1, 2, 2]

    def broken(builder: _Builder) -> int:
        raise ValueError("replica 'b': no type known")

    with pytest.raises(ValueError, match="no type known"):
        builders.run(broken, "replica b")
    assert len(made) == 3 and builders.renewed() == []


def test_a_follower_run_with_a_broken_replica_follows_the_others_then_fails(
        spark, make_config, tmp_path) -> None:
    pipeline = make_config([{"source": "shop.orders", "replica": "broken",
                           "key_columns": ["nope"]},
                          {"source": "shop.orders", "replica": "orders"}],
                         dagster={"replica_poll_seconds": 0.2})
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_none=True)))
    orders = Source("shop.orders")
    part = Partition(ChangelogWriter(pipeline))
    part.write(part.records([[orders.insert(row(1))], [orders.insert(row(2))]]))
    with dg.instance_for_test() as instance:
        result = follow_replicas_job.execute_in_process(
            instance=instance, resources={"binlake": BinlakeResource(config_path=str(path))},
            run_config={"ops": {"follow_replicas": {"config": {"seconds": 1}}}},
            raise_on_error=False)
    assert not result.success
    mats = [e.asset_key.path[-1] for e in result.all_events if e.is_step_materialization]
    assert mats == ["orders"]
    (check,) = [e for e in result.get_asset_check_evaluations()
                if e.check_name == ROW_COUNT_CHECK]
    assert check.asset_key == replica_key("orders") and check.passed
    (failure,) = result.get_step_failure_events()
    message = failure.step_failure_data.error.cause.message
    assert "1 of 2 replicas failed: broken: replica 'broken': no type known" in message


def test_the_follower_hands_the_spark_pool_over_to_a_waiting_run() -> None:
    with dg.instance_for_test() as instance:
        instance.event_log_storage.set_concurrency_slots(SPARK_POOL, 1)
        storage = instance.event_log_storage
        assert storage.claim_concurrency_slot(SPARK_POOL, "follower", "follow_replicas"
                                              ).is_claimed
        assert not pool_wanted(instance, "follower")
        # A replica rebuild launched from the UI: its step waits for the slot.
        assert not storage.claim_concurrency_slot(SPARK_POOL, "rebuild", "replicas"
                                                  ).is_claimed
        assert pool_wanted(instance, "follower")


def test_the_sensor_keeps_one_follower_going_only_when_configured(make_config, tmp_path
                                                                   ) -> None:
    def tick(instance, seconds: float):
        pipeline = make_config([{"source": "shop.orders", "replica": "orders"}],
                             dagster={"replica_follow_seconds": seconds})
        path = tmp_path / f"binlake-{seconds}.yaml"
        path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_none=True)))
        return replica_follower_sensor(dg.build_sensor_context(
            instance=instance, resources={"binlake": BinlakeResource(config_path=str(path))}))

    with dg.instance_for_test() as instance:
        assert isinstance(tick(instance, 0), dg.SkipReason)
        assert isinstance(tick(instance, 60), dg.RunRequest)
        instance.create_run_for_job(follow_replicas_job, status=dg.DagsterRunStatus.STARTED)
        assert instance.get_runs()[0].job_name == FOLLOW_JOB_NAME
        skip = tick(instance, 60)
        assert isinstance(skip, dg.SkipReason) and "running" in skip.skip_message


def test_the_sensor_fails_a_follower_run_whose_process_is_gone(make_config, tmp_path
                                                               ) -> None:
    """A follower run whose process died after the code server that launched it stays
    STARTED with nobody to fail it; the sensor fails it and starts the next."""
    from dagster._core.events import DagsterEvent, DagsterEventType, EngineEventData

    pipeline = make_config([{"source": "shop.orders", "replica": "orders"}],
                           dagster={"replica_follow_seconds": 60})
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_none=True)))
    dead = subprocess.Popen(["true"])
    dead.wait()
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(follow_replicas_job,
                                          status=dg.DagsterRunStatus.STARTING)
        instance.report_dagster_event(DagsterEvent(
            event_type_value=DagsterEventType.RUN_START.value, job_name=FOLLOW_JOB_NAME),
            run_id=run.run_id)
        instance.report_engine_event("Executing steps in process", run,
                                     EngineEventData.in_process(dead.pid))
        assert isinstance(replica_follower_sensor(dg.build_sensor_context(
            instance=instance, resources={"binlake": BinlakeResource(config_path=str(path))})),
            dg.RunRequest)
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
