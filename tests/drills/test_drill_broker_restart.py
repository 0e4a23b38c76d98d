"""Drills: the Kafka broker restarts, or freezes, in the middle of a bounded run.

A dedicated broker (not the session's) holds one topic of Debezium envelopes for
`restart.items` whose final state the test models. A run of the changelog asset's code
(`consume_partition`, slow handlers, small commit points) starts; once it has committed
once, the broker is either stopped and, a few seconds later, started again on the same port
and data, or frozen (SIGSTOP: connections stay open and nothing answers). After a restart
the run must recover and finish, or fail with a clear error; a frozen broker must fail it
at `dagster.commit_timeout_seconds`, naming the partition and offset (librdkafka's
synchronous commit alone waits forever). Then a rerun catches up to the end offset, the
changelog holds every offset exactly once, and the replica built from it equals the model.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import orjson
from changelog_reads import changelog_frame
from confluent_kafka import Consumer, Producer, TopicPartition
from drill_lib import changelog_coordinates, coordinate_diff

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.kafka_commit import CommitTimeout
from binlog_assets.consume.run import RunSummary
from binlog_assets.dev import drills
from binlog_assets.dev.kafka import KafkaBroker, create_topic
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.rounds.round import consume_partition

RECORDS = 3000
DOWN_SECONDS = 5.0
COMMIT_TIMEOUT_SECONDS = 5.0  # the frozen-broker drill's deadline


def _stream(seed: int) -> tuple[list[tuple[bytes, bytes]], dict[int, str]]:
    """Debezium envelopes (key, value) and the table's final state: id -> v."""
    rng = random.Random(seed)
    state: dict[int, str] = {}
    out = []
    for i in range(RECORDS):
        key = rng.randint(0, 199)
        if key in state and rng.random() < 0.2:
            before, after, op = {"id": key, "v": state.pop(key)}, None, "d"
        else:
            op = "u" if key in state else "c"
            before = {"id": key, "v": state[key]} if key in state else None
            state[key] = f"v{i}"
            after = {"id": key, "v": state[key]}
        value = {"before": before, "after": after, "op": op, "ts_ms": i,
                 "source": {"db": "restart", "table": "items", "file": "mysql-bin.000004",
                            "pos": 1000 + i, "row": 0, "snapshot": "false", "ts_ms": i}}
        out.append((orjson.dumps({"id": key}), orjson.dumps(value)))
    return out, state


def _committed(bootstrap: str, group: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return c.committed([TopicPartition(topic, 0)], timeout=5)[0].offset
    except Exception:  # not reachable (yet): no progress to report
        return -1
    finally:
        c.close()


def test_broker_restart_mid_run_then_rerun_loses_nothing(
    pipeline_config: PipelineConfig, spark, tmp_path_factory
) -> None:
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka-restart"), c1=True)
    broker.start()
    try:
        _drill_restart(broker, pipeline_config, spark)
    finally:
        broker.stop()


def test_frozen_broker_fails_the_run_at_the_commit_deadline_then_rerun_loses_nothing(
    pipeline_config: PipelineConfig, spark, tmp_path_factory
) -> None:
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka-freeze"), c1=True)
    broker.start()
    pid = broker.running_pid()
    assert pid is not None
    try:
        _drill_freeze(broker, pid, pipeline_config, spark)
    finally:
        os.kill(pid, signal.SIGCONT)
        broker.stop()


class _Drill:
    """One topic of `_stream`'s envelopes on `broker`, its config and a first run in a
    thread, stopped at its first commit."""

    def __init__(self, broker: KafkaBroker, pipeline_config: PipelineConfig,
                 name: str, commit_timeout_seconds: float | None = None) -> None:
        self.began = time.monotonic()
        bootstrap = self.bootstrap = broker.bootstrap_servers
        self.topic = topic = create_topic(bootstrap, name)
        records, self.model = _stream(seed=7)
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        for key, value in records:
            p.produce(topic, key=key, value=value)
        assert p.flush(60) == 0
        del p  # clients left open reconnect (and log about it) through the downtime

        data = pipeline_config.model_dump(mode="json", exclude_none=True)
        data["kafka"] = {**data["kafka"], "bootstrap.servers": bootstrap,
                         "group.id": f"g-{topic}"}
        data["lakehouse"] = {**data["lakehouse"], "database": f"drill_{name}"}
        if commit_timeout_seconds is not None:
            data["dagster"] = {**data.get("dagster", {}),
                               "commit_timeout_seconds": commit_timeout_seconds}
        # Commit points every 1000 records (2 x max_in_flight): the broker goes after the
        # first, with two more to come.
        data["sources"] = [{"name": name, "topics": [topic], "format": "debezium",
                            "lanes": 4, "max_in_flight": 500,
                            "tables": [{"source": "restart.items", "replica": "items"}]}]
        self.pipeline = pipeline = parse_config(data)
        self.group = pipeline.kafka["group.id"]
        self.registry = HandlerRegistry()
        self.registry.register(r".*", lambda event: time.sleep(0.002), name="slow")
        self.key = f"{topic}:0"
        self.outcome: dict[str, object] = {}
        self.thread = threading.Thread(target=self._first_run)

    def _first_run(self) -> None:
        try:
            self.outcome["run"] = consume_partition(
                self.pipeline, dict(self.pipeline.kafka), self.key,
                ChangelogRunConfig(max_seconds=600), self.registry, group=self.group)[0]
        except Exception as e:  # the outcome is what the drill reports
            self.outcome["run"] = e

    def start_until_first_commit(self) -> int:
        """Start the first run; the offset of its first commit, once Kafka has it."""
        self.thread.start()
        deadline = time.monotonic() + 600
        committed = -1
        while self.thread.is_alive() and time.monotonic() < deadline:
            committed = _committed(self.bootstrap, self.group, self.topic)
            if committed > 0:
                break
            time.sleep(0.5)
        assert committed > 0, f"the first run made no commit: {self.outcome}"
        return committed

    def rerun_and_compare(self, spark, name: str, first: str, extra: dict) -> dict:
        """A rerun to the end, the changelog's coordinates and the replica against the
        model; the figures are recorded as drill `name` and returned."""
        pipeline, topic = self.pipeline, self.topic
        rerun, _sink = consume_partition(pipeline, dict(pipeline.kafka), self.key,
                                         ChangelogRunConfig(), self.registry, group=self.group)
        changelog = changelog_frame(spark, pipeline).where(f"topic = '{topic}'")
        got = changelog_coordinates(changelog)
        diff = coordinate_diff({(topic, 0, o, 0): 1 for o in range(RECORDS)}, got)
        ReplicaBuilder(spark, pipeline).apply("items")
        live = {r["id"]: r["v"]
                for r in spark.table(f"{pipeline.lakehouse.database}.items_current").collect()}
        model = self.model
        mismatches = len(set(live.items()) ^ set(model.items()))
        figures = {
            "records": RECORDS, **extra, "first_run": first,
            "rerun_start_offset": rerun.start_offset,
            "rerun_checkpoint": rerun.checkpoint_source,
            "rerun_records": rerun.records, "rerun_committed": rerun.committed_offset,
            "changelog_rows": sum(got.values()), "changelog_missing": diff["missing"],
            "changelog_duplicates": diff["duplicates"], "rows_compared": len(model) + len(live),
            "mismatches": mismatches, "seconds": round(time.monotonic() - self.began, 1),
        }
        drills.record(name, figures)
        print(f"\n{name}: first run {first[:300]}; rerun from {rerun.start_offset} "
              f"({rerun.checkpoint_source}); changelog {diff}; replica {len(live)} rows, "
              f"model {len(model)}, mismatches {mismatches}")
        assert rerun.committed_offset == RECORDS
        assert diff == {"missing": 0, "unexpected": 0, "duplicates": 0}, diff
        assert mismatches == 0 and len(live) == len(model)
        return figures


def _drill_restart(broker: KafkaBroker, pipeline_config: PipelineConfig, spark) -> None:
    drill = _Drill(broker, pipeline_config, "restart")
    committed_before = drill.start_until_first_commit()
    restarted = drill.thread.is_alive()
    if restarted:
        broker.stop()
        time.sleep(DOWN_SECONDS)
        broker.start()
    drill.thread.join(900)
    assert not drill.thread.is_alive(), "the first run neither finished nor failed in 15 min"
    first = drill.outcome["run"]
    recovered = isinstance(first, RunSummary) and first.committed_offset == RECORDS
    if not recovered:
        # A failure must say what happened: a Kafka error, not a silent stop.
        assert isinstance(first, Exception) and str(first), repr(first)
    drill.rerun_and_compare(
        spark, "broker_restart",
        "recovered" if recovered else f"failed: {type(first).__name__}: {str(first)[:200]}",
        {"broker_restarted_mid_run": restarted, "committed_before_restart": committed_before,
         "down_seconds": DOWN_SECONDS})
    assert restarted, "the first run finished before the broker could be restarted"


def _drill_freeze(broker: KafkaBroker, pid: int, pipeline_config: PipelineConfig,
                  spark) -> None:
    drill = _Drill(broker, pipeline_config, "freeze", COMMIT_TIMEOUT_SECONDS)
    committed_before = drill.start_until_first_commit()
    frozen = drill.thread.is_alive()
    assert frozen, "the first run finished before the broker could be frozen"
    os.kill(pid, signal.SIGSTOP)
    froze_at = time.monotonic()
    # The next commit point meets the frozen coordinator: the run fails at its deadline
    # (plus the handlers' and the changelog's share of the commit point).
    drill.thread.join(COMMIT_TIMEOUT_SECONDS + 60)
    ended_after = time.monotonic() - froze_at
    alive = drill.thread.is_alive()
    os.kill(pid, signal.SIGCONT)
    assert not alive, f"the run still waits on the frozen broker after {ended_after:.0f} s"
    first = drill.outcome["run"]
    assert isinstance(first, CommitTimeout), repr(first)
    assert f"committing {drill.topic}[0]@" in str(first), str(first)
    assert "commit_timeout_seconds" in str(first)
    drill.rerun_and_compare(
        spark, "broker_frozen", f"failed: CommitTimeout: {str(first)[:200]}",
        {"committed_before_freeze": committed_before,
         "commit_timeout_seconds": COMMIT_TIMEOUT_SECONDS,
         "run_ended_seconds_after_freeze": round(ended_after, 1)})
