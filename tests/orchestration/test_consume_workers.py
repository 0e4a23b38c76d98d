"""A run with a large backlog hands partitions to worker processes (`consume_workers.py`):
every partition is still committed once, its handlers run where it is consumed, and a
worker does not outlive a killed run by more than a second."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from run_inputs import changelog_coordinates, handled_events, handlers_run

from binlog_assets.config import PipelineConfig, load_config, parse_config
from binlog_assets.consume import backlog
from binlog_assets.consume.lag import PartitionLag
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.rounds import workers as consume_workers
from binlog_assets.rounds.keys import parse_partition_key
from binlog_assets.rounds.partition import RunLimits, SinkTotals
from binlog_assets.rounds.round import RoundOptions, consume_partitions
from binlog_assets.rounds.workers import worker_rule

CHILD = Path(__file__).with_name("workers_child.py")
PER_PARTITION = {0: 400, 1: 300, 2: 350, 3: 250}


def _setup(pipeline_config: PipelineConfig, tmp_path: Path) -> tuple[Path, list[str], Path]:
    """Four partitions with records in each, run with one lane (a slowed handler slows
    its partition down by as much)."""
    return handlers_run(pipeline_config, tmp_path, "workers", PER_PARTITION, lanes=1)


def _exactly_once(pipeline: PipelineConfig, keys: list[str]) -> None:
    coordinates = changelog_coordinates(pipeline)
    assert coordinates == Counter({(p, o): 1 for p, n in PER_PARTITION.items()
                                   for o in range(n)})
    writer, group = ChangelogWriter(pipeline), pipeline.kafka["group.id"]
    topic = keys[0].rsplit(":", 1)[0]
    assert {p: writer.checkpoint(group, topic, p) for p in PER_PARTITION} == PER_PARTITION


def worker_processes(pipeline: PipelineConfig, kafka_conf: dict, keys: Sequence[str],
                     run_config: RunLimits, group: str,
                     lags: Mapping[str, int] | None = None) -> int:
    """`WorkerRule.processes` by the pipeline config, for the partitions `keys`."""
    partitions = {k: parse_partition_key(k) for k in keys}
    return worker_rule(pipeline, run_config).processes(kafka_conf, group, partitions, lags)


def test_worker_processes_are_used_only_for_a_large_backlog(monkeypatch) -> None:
    lags = [PartitionLag("t", p, 0, 1000, c) for p, c in ((0, 900), (1, None), (2, 0))]
    monkeypatch.setattr(backlog, "measure_lag", lambda *a, **k: lags)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    keys = ["t:0", "t:1"]  # 100 + 1000 records to read; t:2 is not the run's

    def count(run: ChangelogRunConfig | None = None, keys: list[str] = keys,
              **dagster: int | None) -> int:
        pipeline = parse_config({"dagster": {"worker_backlog_records": 1100, **dagster}})
        return worker_processes(pipeline, {}, keys, run or ChangelogRunConfig(), "g")

    assert count() == 1  # one per core beyond the first, at most one per other partition
    assert count(keys=["t:0", "t:1", "t:2"]) == 2
    assert count(keys=["t:0", "t:1", "t:2", "t:3"], worker_backlog_records=1) == 3
    assert count(worker_processes=0) == 0
    assert count(keys=["t:1"]) == 0  # one partition: nothing to share
    assert count(worker_backlog_records=1101) == 0
    # A run that stops after 500 records a partition reads 600 of them.
    assert count(ChangelogRunConfig(max_records=500), worker_backlog_records=600) == 1
    assert count(ChangelogRunConfig(max_records=500), worker_backlog_records=601) == 0

    def unreachable(*args, **kwargs) -> list[PartitionLag]:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "no answer"))

    # Without the lag the run still goes on, in its own process.
    monkeypatch.setattr(backlog, "measure_lag", unreachable)
    assert count() == 0
    # Lags the caller has just measured (the follower's) are not measured again.
    pipeline = parse_config({"dagster": {"worker_backlog_records": 1100}})
    measured = {"t:0": 100, "t:1": 1000, "t:2": 5000}
    assert worker_processes(pipeline, {}, keys, ChangelogRunConfig(), "g", measured) == 1
    assert worker_processes(pipeline, {}, keys, ChangelogRunConfig(max_records=500), "g",
                            measured) == 0


def test_an_exception_that_cannot_travel_is_sent_as_its_text() -> None:
    class Unpicklable(Exception):
        def __init__(self, lock) -> None:
            super().__init__("held")
            self.lock = lock

    import threading

    sent = consume_workers._picklable(Unpicklable(threading.Lock()))
    assert type(sent) is RuntimeError and str(sent) == "Unpicklable: held"
    plain = ValueError("bad row")
    assert consume_workers._picklable(plain) is plain


def test_a_large_backlog_is_shared_with_a_worker_process(
        pipeline_config: PipelineConfig, tmp_path: Path, monkeypatch) -> None:
    config_path, keys, handled = _setup(pipeline_config, tmp_path)
    monkeypatch.setenv("BINLAKE_TEST_HANDLED", str(handled))
    pipeline = load_config(config_path)
    outcomes = consume_partitions(pipeline, dict(pipeline.kafka), keys, ChangelogRunConfig(),
                                  group=pipeline.kafka["group.id"],
                                  options=RoundOptions(parallel=1))
    assert [o.error for o in outcomes] == [None] * len(keys)
    assert [o.summary.committed_offset for o in outcomes] == list(PER_PARTITION.values())
    remote = [o for o in outcomes if isinstance(o.sink, SinkTotals)]
    assert remote and len(remote) < len(keys)  # both the run and its worker took some
    for o in outcomes:
        assert o.sink.rows == o.summary.events == o.summary.committed_offset
        assert o.sink.version is not None
    _exactly_once(pipeline, keys)
    # Each event handled once, by the process that consumed its partition.
    events = handled_events(handled)
    assert Counter((p, o) for _, p, o in events) == Counter(
        {(p, o): 1 for p, n in PER_PARTITION.items() for o in range(n)})
    by_partition = {p: pid for pid, p, _ in events}
    workers = {by_partition[int(o.key.rsplit(":", 1)[1])] for o in remote}
    assert os.getpid() not in workers
    assert {pid for pid, _, _ in events} == workers | {os.getpid()}


def test_a_worker_that_dies_fails_its_partition_only(
        pipeline_config: PipelineConfig, tmp_path: Path, monkeypatch) -> None:
    import threading
    from concurrent.futures.process import BrokenProcessPool

    config_path, keys, handled = _setup(pipeline_config, tmp_path)
    monkeypatch.setenv("BINLAKE_TEST_HANDLED", str(handled))
    monkeypatch.setenv("BINLAKE_TEST_HANDLER_MS", "5")
    pipeline = load_config(config_path)
    outcomes = []

    def run() -> None:
        outcomes.extend(consume_partitions(pipeline, dict(pipeline.kafka), keys,
                                           ChangelogRunConfig(),
                                           group=pipeline.kafka["group.id"],
                                           options=RoundOptions(parallel=1)))

    runner = threading.Thread(target=run)
    runner.start()
    deadline = time.monotonic() + 120
    workers: set[int] = set()
    while not workers and time.monotonic() < deadline and runner.is_alive():
        time.sleep(0.05)
        workers = {pid for pid, _, _ in handled_events(handled)} - {os.getpid()}
    assert len(workers) == 1
    os.kill(workers.pop(), signal.SIGKILL)
    runner.join(timeout=180)
    failed = [o for o in outcomes if o.error is not None]
    assert len(failed) == 1 and isinstance(failed[0].error, BrokenProcessPool), outcomes
    # The run's own threads took every other partition, to its end.
    assert [o.summary.committed_offset for o in outcomes if o.error is None] == [
        n for k, n in zip(keys, PER_PARTITION.values(), strict=True) if k != failed[0].key]
    # Nothing is lost: the next run resumes the failed partition from the changelog.
    monkeypatch.setenv("BINLAKE_TEST_HANDLER_MS", "0")
    again = consume_partitions(pipeline, dict(pipeline.kafka), keys, ChangelogRunConfig(),
                               group=pipeline.kafka["group.id"], options=RoundOptions(parallel=1))
    assert [o.error for o in again] == [None] * len(keys)
    _exactly_once(pipeline, keys)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.timeout(240)
def test_a_worker_stops_when_its_run_is_killed(pipeline_config: PipelineConfig,
                                               tmp_path: Path) -> None:
    config_path, keys, handled = _setup(pipeline_config, tmp_path)
    env = {**os.environ, "BINLAKE_TEST_HANDLED": str(handled), "BINLAKE_TEST_HANDLER_MS": "5",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    child = subprocess.Popen([sys.executable, str(CHILD), str(config_path), *keys], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        workers: set[int] = set()
        while not workers and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
            workers = {pid for pid, _, _ in handled_events(handled)} - {child.pid}
        assert workers, child.communicate(timeout=30)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        killed = time.monotonic()
        while not all(map(_gone, workers)) and time.monotonic() - killed < 10:
            time.sleep(0.05)
        stopped = time.monotonic() - killed
        assert all(map(_gone, workers)), f"worker {workers} still running after {stopped:.1f}s"
        assert stopped < 3
    finally:
        if child.poll() is None:
            child.kill()
    pipeline = load_config(config_path)
    assert sum(changelog_coordinates(pipeline).values()) < sum(PER_PARTITION.values())
    # The next run takes over from the changelog: every event in it exactly once.
    env["BINLAKE_TEST_HANDLER_MS"] = "0"
    rerun = subprocess.run([sys.executable, str(CHILD), str(config_path), *keys], env=env,
                           capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    results = [json.loads(line.split(" ", 1)[1]) for line in rerun.stdout.splitlines()
               if line.startswith("WORKERS-RESULT ")]
    assert [(r["error"], r["committed"]) for r in results] == [
        (None, n) for n in PER_PARTITION.values()]
    _exactly_once(pipeline, keys)
