"""The changelog follower: one run that keeps consuming partitions as records arrive.

The loop and its due rule on fakes; then a real follower run (in process, on the real
broker and the changelog's Delta table) while records keep arriving: every record lands
in the changelog once, each round that read records is its partition's materialization
as it ends, a partition another consumer run holds is left to it, and the lag sensor
stands aside while the follower is configured.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pytest
import yaml
from confluent_kafka import KafkaError, KafkaException
from run_inputs import changelog_coordinates, produce_inserts, run_config_file

from binlog_assets.config import PipelineConfig, load_config
from binlog_assets.consume.lag import measure_lag
from binlog_assets.dev.kafka import create_topic
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.orchestration.changelog_follower import (
    DueRule,
    RowCount,
    changelog_follower_sensor,
    follow_changelog_job,
    follow_partitions,
)
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.orchestration.partitions import (
    CHANGELOG_ASSET_KEY,
    KAFKA_PARTITIONS_NAME,
    partition_key,
)
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.sensors import kafka_lag_sensor
from binlog_assets.orchestration.shared import CONSUME_JOB_NAME, PARTITION_TAG
from binlog_assets.rounds.partition import PartitionOutcome, SinkTotals
from binlog_assets.rounds.plan import plan_run
from binlog_assets.rounds.report import RoundReport
from binlog_assets.rounds.round import RoundOptions


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rounds_follow_each_other_and_a_failed_partition_rests(monkeypatch) -> None:
    clock = Clock()
    sleeps: list[float] = []
    monkeypatch.setattr(time, "sleep", lambda s: (sleeps.append(s),
                                                  setattr(clock, "now", clock.now + s)))
    rounds = [["a:0", "b:0"], ["a:0", "b:0"], ["a:0", "b:0"], [], ["a:0", "b:0"]]
    consumed: list[list[str]] = []

    def consume(keys: list[str]) -> list[PartitionOutcome]:
        consumed.append(keys)
        clock.now += 1.0
        return [PartitionOutcome(k, error=RuntimeError("down") if k == "b:0" else None)
                for k in keys]

    outcomes = list(follow_partitions(lambda: rounds.pop(0), consume, poll=0.5,
                                      stop=lambda: not rounds, retry=2.5, clock=clock))
    # b:0 failed at t=1: it rests until t=3.5, so rounds at t=1 and t=2 leave it out; an
    # idle round waits one poll (t=3 -> 3.5), and then b:0 is tried again.
    assert consumed == [["a:0", "b:0"], ["a:0"], ["a:0"], ["a:0", "b:0"]]
    assert sleeps == [0.5]  # only the idle round waited
    assert len(outcomes) == 4


def test_due_rule_is_the_lag_sensors() -> None:
    rule = DueRule(threshold=10, staleness=30)
    assert rule.due({"a:0": 10, "b:0": 3, "c:0": 0}, now=100) == ["a:0"]
    assert rule.due({"a:0": 0, "b:0": 4}, now=120) == []
    # b:0 has lagged since t=100: stale at 130; a:0 starts lagging anew.
    assert rule.due({"a:0": 2, "b:0": 4}, now=130) == ["b:0"]
    assert rule.due({"a:0": 2, "b:0": 0}, now=140) == []
    assert DueRule(threshold=0, staleness=300).due({"a:0": 1, "b:0": 0}, now=0) == ["a:0"]


def test_a_round_measures_the_lags_twice_through_the_kept_consumer(
        monkeypatch, tmp_path: Path) -> None:
    """At the round's start (which partitions are due, and the worker processes' rule)
    and after it (the lag at the end, every source at once): no other consumer."""
    from binlog_assets.consume import backlog, lag, preflight
    from binlog_assets.consume.lag import PartitionLag
    from binlog_assets.orchestration import changelog_follower
    from binlog_assets.rounds import report as round_report

    consumers: list[object] = []
    ends = iter(range(10, 1000, 10))

    def measure_lag(kafka_conf: dict, group: str, topics: list[str], *, check: bool = True,
                    consumer: object = None) -> list[PartitionLag]:
        consumers.append(consumer)
        return [PartitionLag(t, 0, 0, next(ends), 0) for t in topics]

    def elsewhere(*args: object, **kwargs: object) -> list[PartitionLag]:
        raise AssertionError("lag measured through another consumer")

    monkeypatch.setattr(lag, "measure_lag", measure_lag)
    monkeypatch.setattr(lag, "lag_consumer", lambda *a, **k: Kept())
    monkeypatch.setattr(preflight, "check_cluster", lambda conf: None)
    monkeypatch.setattr(backlog, "measure_lag", elsewhere)
    monkeypatch.setattr(round_report, "measure_lag", elsewhere)
    rounds: list[tuple[list[str], dict]] = []
    reports: list[dict] = []

    def consume(options: RoundOptions, keys: list[str]) -> list[PartitionOutcome]:
        rounds.append((keys, options.lags))
        return [PartitionOutcome(k) for k in keys]

    def report_round(context: object, report: RoundReport, **kwargs: object) -> bool:
        reports.append({(pl.topic, pl.partition): pl.high for pl in report.lags})
        return True

    monkeypatch.setattr(changelog_follower, "consume_round", _round_of(consume))
    monkeypatch.setattr(changelog_follower, "report_round", report_round)
    monkeypatch.setattr(changelog_follower, "changelog_backfill_in_progress",
                        lambda instance: "enough" if len(rounds) >= 3 else None)
    (tmp_path / "binlake.yaml").write_text(yaml.safe_dump({
        "kafka": {"bootstrap.servers": "localhost:1", "group.id": "g"},
        "sources": [{"name": "a", "topics": ["a"]}, {"name": "b", "topics": ["b"]}]}))
    resource = BinlakeResource(config_path=str(tmp_path / "binlake.yaml"))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, ["a:0", "b:0"])
        result = follow_changelog_job.execute_in_process(
            instance=instance, resources={"binlake": resource},
            run_config={"ops": {"follow_changelog": {"config": {"seconds": 60}}}})
    assert result.success
    assert len(rounds) == len(reports) == 3
    assert len(consumers) == 6 and all(isinstance(c, Kept) for c in consumers)
    assert len({id(c) for c in consumers}) == 1
    # Each round's worker rule gets the lags due() measured; its report those measured
    # after it (the ends grow by 10 at each measurement here).
    assert rounds[0] == (["a:0", "b:0"], {"a:0": 10, "b:0": 20})
    assert reports[0] == {("a", 0): 30, ("b", 0): 40}
    assert rounds[1][1] == {"a:0": 50, "b:0": 60}


def test_a_lag_measurement_that_waited_for_the_broker_is_a_warning(
        monkeypatch, tmp_path: Path) -> None:
    """A broker restarting or frozen holds the follower's lag measurement (librdkafka
    waits for it): the run logs a warning naming Kafka and the wait, and goes on; a
    measurement that fails is named too before the run fails with its error."""
    from binlog_assets.consume import lag, preflight
    from binlog_assets.consume.lag import PartitionLag
    from binlog_assets.orchestration import changelog_follower

    calls = iter(range(100))

    def measure_lag(kafka_conf: dict, group: str, topics: list[str], *, check: bool = True,
                    consumer: object = None) -> list[PartitionLag]:
        n = next(calls)
        if n == 1:
            time.sleep(0.3)  # the broker away, then back
        if n == 3:
            time.sleep(0.3)
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "all brokers down"))
        return [PartitionLag(t, 0, 0, 0, 0) for t in topics]

    monkeypatch.setattr(lag, "measure_lag", measure_lag)
    monkeypatch.setattr(lag, "SLOW_ANSWER_SECONDS", 0.2)
    monkeypatch.setattr(lag, "lag_consumer", lambda *a, **k: Kept())
    monkeypatch.setattr(preflight, "check_cluster", lambda conf: None)
    monkeypatch.setattr(changelog_follower, "changelog_backfill_in_progress",
                        lambda instance: None)
    (tmp_path / "binlake.yaml").write_text(yaml.safe_dump({
        "kafka": {"bootstrap.servers": "localhost:1", "group.id": "g"},
        "dagster": {"changelog_poll_seconds": 0.01},
        "sources": [{"name": "a", "topics": ["a"]}]}))
    resource = BinlakeResource(config_path=str(tmp_path / "binlake.yaml"))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, ["a:0"])
        result = follow_changelog_job.execute_in_process(
            instance=instance, resources={"binlake": resource}, raise_on_error=False,
            run_config={"ops": {"follow_changelog": {"config": {"seconds": 60}}}})
        warnings = [e.message for e in instance.all_logs(result.run_id)
                    if e.level == logging.WARNING]
    assert not result.success
    assert len(warnings) == 2, warnings
    assert re.match(r"waited \d+\.\d s for Kafka at localhost:1 \(PLAINTEXT\) to answer "
                    r"the lag measurement of 1 topics: a broker was unreachable", warnings[0])
    assert re.match(r"Kafka at localhost:1 \(PLAINTEXT\) did not answer the lag measurement "
                    r"of 1 topics for \d+\.\d s", warnings[1])


def _follow_one_partition(instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch,
                          tmp_path: Path, rounds: int, waits: Callable[[int], float],
                          cluster_waits: Callable[[int], float] = lambda n: 0.0) -> str:
    """A follower run on `instance` over partition `a:0` (lag 5,000) for `rounds` rounds
    of 5 records each, the round numbered n waiting `waits(n)` s on Kafka in its
    partition and `cluster_waits(n)` s in its cluster check; its id."""
    from binlog_assets.consume import lag, preflight
    from binlog_assets.consume.lag import PartitionLag
    from binlog_assets.consume.run import RunSummary
    from binlog_assets.orchestration import changelog_follower

    monkeypatch.setattr(lag, "measure_lag", lambda *a, **k: [PartitionLag("a", 0, 0, 5000, 0)])
    monkeypatch.setattr(lag, "lag_consumer", lambda *a, **k: Kept())
    monkeypatch.setattr(preflight, "check_cluster", lambda conf: None)
    done: list[int] = []

    def consume(options: RoundOptions, keys: list[str]) -> list[PartitionOutcome]:
        done.append(1)
        summary = RunSummary("a", 0, 0, "kafka", 5, 5, records=5,
                             kafka_wait_seconds=waits(len(done)))
        return [PartitionOutcome("a:0", summary, SinkTotals(5, 1))]

    monkeypatch.setattr(changelog_follower, "consume_round", _round_of(
        consume, lambda: cluster_waits(len(done))))
    monkeypatch.setattr(changelog_follower, "delta_row_count", lambda uri: 5)
    monkeypatch.setattr(changelog_follower, "changelog_backfill_in_progress",
                        lambda instance: "enough" if len(done) >= rounds else None)
    (tmp_path / "binlake.yaml").write_text(yaml.safe_dump({
        "kafka": {"bootstrap.servers": "localhost:1", "group.id": "g"},
        "lakehouse": {"path": str(tmp_path / "lake")},
        "sources": [{"name": "a", "topics": ["a"]}]}))
    resource = BinlakeResource(config_path=str(tmp_path / "binlake.yaml"))
    instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, ["a:0"])
    result = follow_changelog_job.execute_in_process(
        instance=instance, resources={"binlake": resource},
        run_config={"ops": {"follow_changelog": {"config": {"seconds": 60}}}})
    assert len(done) == rounds
    return result.run_id


def test_a_round_that_waited_on_a_frozen_broker_is_a_warning(
        monkeypatch, tmp_path: Path) -> None:
    """A frozen broker raises no error: a round whose partition waited on it (for
    records, its end offset or a commit) names the partition, Kafka and the wait."""
    # The second round's 0.4 s is no wait worth a line.
    with dg.instance_for_test() as instance:
        run_id = _follow_one_partition(instance, monkeypatch, tmp_path, rounds=2,
                                       waits=lambda n: 13.2 if n == 1 else 0.4)
        warnings = [e.message for e in instance.all_logs(run_id)
                    if e.level == logging.WARNING]
    assert warnings == ["a:0 waited 13.2 s at once for Kafka at localhost:1 (PLAINTEXT) "
                        "(for records below its end offset, its end offset or a commit): "
                        "a broker was unreachable or not answering, or a producer's open "
                        "transaction held the records back"], warnings


def test_a_round_whose_cluster_check_waited_on_a_frozen_broker_is_a_warning(
        monkeypatch, tmp_path: Path) -> None:
    """A freeze that meets a round before its partitions start (its cluster check)
    is named too: nothing else of the round waits then."""
    with dg.instance_for_test() as instance:
        run_id = _follow_one_partition(instance, monkeypatch, tmp_path, rounds=2,
                                       waits=lambda n: 0.0,
                                       cluster_waits=lambda n: 13.2 if n == 1 else 0.4)
        warnings = [e.message for e in instance.all_logs(run_id)
                    if e.level == logging.WARNING]
    assert warnings == ["waited 13.2 s for Kafka at localhost:1 (PLAINTEXT) to answer the "
                        "round's cluster check: a broker was unreachable or not answering, "
                        "and no partition was consumed meanwhile"], warnings


def test_a_round_s_events_are_not_kept_by_the_run(monkeypatch, tmp_path: Path) -> None:
    """Dagster keeps each event an op logs until the op yields: a follower that never
    yielded kept every materialization of its 10 minutes (its RSS grew about 40 MB a
    minute in the soak). Each round's events are handed on as the round ends."""
    from binlog_assets.orchestration import changelog_follower

    kept: list[int] = []  # events the op holds after each round's report
    real_report = changelog_follower.report_round

    def report_round(context: dg.OpExecutionContext, *args: object, **kwargs: object
                     ) -> bool:
        consumed = real_report(context, *args, **kwargs)
        kept.append(len(context._events))
        return consumed

    monkeypatch.setattr(changelog_follower, "report_round", report_round)
    with dg.instance_for_test() as instance:
        _follow_one_partition(instance, monkeypatch, tmp_path, rounds=30, waits=lambda n: 0.0)
        materialized = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=CHANGELOG_ASSET_KEY), limit=100).records
    assert len(kept) == 30 and len(materialized) == 30  # every round's, in the event log
    # A round logs its partition's materialization and its source's observation.
    assert max(kept) <= 2, kept


def test_lags_measured_after_the_round_are_split_by_source() -> None:
    """A run's report measures its sources' topics at once, and each source's
    observation gets the partitions a measurement of its own topics would."""
    from binlog_assets.config import parse_config
    from binlog_assets.consume.lag import PartitionLag, lags_of

    pipeline = parse_config({"sources": [{"name": "a", "topics": ["^a-.*"]},
                                         {"name": "b", "topics": ["b", "a-1"]},
                                         {"name": "c", "topics": ["c"]}]})
    report = plan_run(pipeline, {}, ["a-1:0", "b:0"], ChangelogRunConfig(), group="g").report
    assert [s.name for s in report.sources] == ["a", "b"]  # c has none of the run's
    assert report.topics == ["^a-.*", "b", "a-1"]
    at_end = [PartitionLag(t, 0, 0, 9, 4) for t in ("a-1", "a-2", "b", "c")]
    assert {s.name: lags_of(at_end, s.topics) for s in report.sources} == {
        "a": at_end[:2], "b": [at_end[0], at_end[2]]}


def _round_of(consume: Callable[[RoundOptions, list[str]], list[PartitionOutcome]],
              cluster_wait: Callable[[], float] = lambda: 0.0) -> Callable[..., RoundReport]:
    """A `consume_round` whose partitions' outcomes are `consume(options, keys)`, its
    report measured as the follower asks (`options.gauge`), its cluster check waiting
    `cluster_wait()` seconds."""
    def consume_round(pipeline: PipelineConfig, kafka_conf: dict, keys: list[str],
                      limits: ChangelogRunConfig, *, group: str,
                      options: RoundOptions) -> RoundReport:
        plan = plan_run(pipeline, kafka_conf, keys, limits, group=group)
        return RoundReport(plan.report, consume(options, plan.keys), options.gauge,
                           cluster_wait())
    return consume_round


class Kept:
    """The follower's one lag consumer."""

    def poll(self, timeout: float) -> None:
        return None

    def close(self) -> None:
        pass


def test_connection_errors_of_the_lag_consumer_are_one_warning() -> None:
    """A broker restarting closes the lag consumer's connections and refuses new ones
    (librdkafka's `_TRANSPORT`, `_ALL_BROKERS_DOWN`): the round that saw them is one
    warning naming Kafka and how long it waited; other errors and no errors are none."""
    from binlog_assets.consume.lag import Unreachable

    unreachable = Unreachable()
    conf = {"bootstrap.servers": "127.0.0.1:9"}
    assert unreachable.warning(conf, "a round of 3 partitions", 0.5) is None
    unreachable(KafkaError(KafkaError._TRANSPORT, "127.0.0.1:9/1: Connection refused"))
    unreachable(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    unreachable(KafkaError(KafkaError._MSG_TIMED_OUT, "not a connection error"))
    line = unreachable.warning(conf, "a round of 3 partitions", 14.2)
    assert line == ("Kafka at 127.0.0.1:9 (PLAINTEXT) was unreachable during a round of 3 "
                    "partitions (2 connection errors, the first: 127.0.0.1:9/1: Connection "
                    "refused); it waited 14.2 s")
    assert unreachable.warning(conf, "a round of 3 partitions", 0.5) is None


def test_the_row_count_is_read_at_most_every_so_often() -> None:
    clock = Clock()
    counts = iter([100, 500])
    row_count = RowCount(lambda: next(counts), every=30, clock=clock)

    def appended(*rows: int) -> list[PartitionOutcome]:
        return [PartitionOutcome(f"t:{i}", sink=SinkTotals(n, 1)) for i, n in enumerate(rows)]

    assert row_count.after(appended(5, 5)) == 100  # the first round counts
    clock.now = 10
    assert row_count.after(appended(3, 4)) == 107  # then adds what the rounds appended
    clock.now = 29
    assert row_count.after([PartitionOutcome("t:0", error=RuntimeError("down"))]) == 107
    clock.now = 40
    assert row_count.after(appended(1)) == 500  # and counts again 30 s after the count


def _materializations(instance: dg.DagsterInstance, key: str) -> list[dg.EventLogRecord]:
    return list(instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=CHANGELOG_ASSET_KEY, asset_partitions=[key]),
        limit=100, ascending=True).records)


@pytest.mark.integration
def test_a_follower_run_consumes_records_as_they_arrive(
        pipeline_config: PipelineConfig, tmp_path: Path) -> None:
    bootstrap = pipeline_config.bootstrap_servers
    topic = create_topic(bootstrap, "follow", partitions=3)
    config_path = run_config_file(pipeline_config, tmp_path,
                                  {"name": "follow", "topics": [topic]},
                                  dagster={"changelog_follow_seconds": 600,
                                           "changelog_poll_seconds": 0.2})
    pipeline = load_config(config_path)
    group = pipeline.kafka["group.id"]
    keys = [partition_key(topic, p) for p in range(3)]
    resource = BinlakeResource(config_path=str(config_path))
    produce_inserts(bootstrap, topic, {0: 5, 1: 4, 2: 3})

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, keys)
        # Partition 2 belongs to a consumer run launched by hand: the follower leaves it.
        instance.add_run(dg.DagsterRun(job_name=CONSUME_JOB_NAME, run_id="held" * 8,
                                       tags={PARTITION_TAG: keys[2]},
                                       status=dg.DagsterRunStatus.STARTED))
        with dg.build_sensor_context(instance=instance,
                                     resources={"binlake": resource}) as context:
            assert isinstance(kafka_lag_sensor(context), dg.SkipReason)
            assert isinstance(changelog_follower_sensor(context), dg.RunRequest)

        def more() -> None:
            # Records arrive while the run follows: a later round reads them.
            deadline = time.monotonic() + 60
            while not _materializations(instance, keys[0]) and time.monotonic() < deadline:
                time.sleep(0.2)
            produce_inserts(bootstrap, topic, {0: 6, 1: 2}, id_base=1000)

        producer = threading.Thread(target=more)
        producer.start()
        result = follow_changelog_job.execute_in_process(
            instance=instance, resources={"binlake": resource},
            run_config={"ops": {"follow_changelog": {"config": {"seconds": 12}}}})
        producer.join()
        assert result.success

        writer = ChangelogWriter(pipeline)
        assert [writer.checkpoint(group, topic, p) for p in range(3)] == [11, 6, None]
        committed = {pl.partition: pl.committed for pl in measure_lag(dict(pipeline.kafka), group,
                                                                       [topic])}
        assert committed == {0: 11, 1: 6, 2: None}
        for key, ends in ((keys[0], [5, 11]), (keys[1], [4, 6])):
            offsets = [r.asset_materialization.metadata["committed_offset"].value
                       for r in _materializations(instance, key)]
            assert offsets == ends, key  # one materialization per round that read records
        # The first round's partitions made their last commit points together: one
        # changelog commit carries both.
        versions = {_materializations(instance, key)[0].asset_materialization.metadata[
            "changelog_version"].value for key in keys[:2]}
        assert len(versions) == 1
        assert _materializations(instance, keys[2]) == []
        # Every record in the changelog once, none of the held partition's.
        assert changelog_coordinates(pipeline) == Counter(
            [(0, o) for o in range(11)] + [(1, o) for o in range(6)])
