"""Drill: the Kafka broker restarts in the middle of a bounded run.

A dedicated broker (not the session's) holds one topic of Debezium envelopes for
`restart.items` whose final state the test models. A run of the changelog asset's code
(`consume_partition`, slow handlers, small commit points) starts; once it has committed
once, the broker is stopped and, a few seconds later, started again on the same port and
data. The run must either recover and finish, or fail with a clear error; then a rerun
catches up to the end offset, the changelog holds every offset exactly once, and the
replica built from it equals the model.
"""

from __future__ import annotations

import random
import threading
import time

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition
from drill_lib import changelog_coordinates, coordinate_diff

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.run import RunSummary
from binlog_assets.dev import drills
from binlog_assets.dev.kafka import KafkaBroker, create_topic
from binlog_assets.lakehouse.changelog_reader import changelog_frame
from binlog_assets.lakehouse.replica import ReplicaBuilder
from binlog_assets.orchestration.consume_runs import ChangelogRunConfig, consume_partition

RECORDS = 3000
DOWN_SECONDS = 5.0


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
    except Exception:  # noqa: BLE001 - not reachable (yet): no progress to report
        return -1
    finally:
        c.close()


def test_broker_restart_mid_run_then_rerun_loses_nothing(
    pipeline_config: PipelineConfig, spark, tmp_path_factory
) -> None:
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka-restart"))
    broker.start()
    try:
        _drill(broker, pipeline_config, spark)
    finally:
        broker.stop()


def _drill(broker: KafkaBroker, pipeline_config: PipelineConfig, spark) -> None:
    began = time.monotonic()
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, "restart")
    records, model = _stream(seed=7)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for key, value in records:
        p.produce(topic, key=key, value=value)
    assert p.flush(60) == 0
    del p  # clients left open reconnect (and log about it) through the downtime

    data = pipeline_config.model_dump(mode="json", exclude_none=True)
    data["kafka"] = {**data["kafka"], "bootstrap.servers": bootstrap,
                     "group.id": f"g-{topic}"}
    data["lakehouse"] = {**data["lakehouse"], "database": "drill_restart"}
    # Commit points every 1000 records (2 x max_in_flight): the broker goes after the
    # first, with two more to come.
    data["sources"] = [{"name": "restart", "topics": [topic], "format": "debezium",
                        "lanes": 4, "max_in_flight": 500,
                        "tables": [{"source": "restart.items", "replica": "items"}]}]
    cfg = parse_config(data)
    group = cfg.kafka["group.id"]
    registry = HandlerRegistry()
    registry.register(r".*", lambda event: time.sleep(0.002), name="slow")
    key = f"{topic}:0"

    outcome: dict[str, object] = {}

    def first_run() -> None:
        try:
            outcome["run"] = consume_partition(cfg, dict(cfg.kafka), key,
                                               ChangelogRunConfig(max_seconds=600), registry,
                                               group=group)[0]
        except Exception as e:  # noqa: BLE001 - the outcome is what the drill reports
            outcome["run"] = e

    thread = threading.Thread(target=first_run)
    thread.start()
    deadline = time.monotonic() + 600
    committed_before = -1
    while thread.is_alive() and time.monotonic() < deadline:
        committed_before = _committed(bootstrap, group, topic)
        if committed_before > 0:
            break
        time.sleep(0.5)
    assert committed_before > 0, f"the first run made no commit: {outcome}"
    restarted = thread.is_alive()
    if restarted:
        broker.stop()
        time.sleep(DOWN_SECONDS)
        broker.start()
    thread.join(900)
    assert not thread.is_alive(), "the first run neither finished nor failed in 15 minutes"
    first = outcome["run"]
    recovered = isinstance(first, RunSummary) and first.committed_offset == RECORDS
    if not recovered:
        # A failure must say what happened: a Kafka error, not a silent stop.
        assert isinstance(first, Exception) and str(first), repr(first)

    rerun, _sink = consume_partition(cfg, dict(cfg.kafka), key, ChangelogRunConfig(),
                                     registry, group=group)
    changelog = changelog_frame(spark, cfg).where(f"topic = '{topic}'")
    got = changelog_coordinates(changelog)
    diff = coordinate_diff({(topic, 0, o, 0): 1 for o in range(RECORDS)}, got)
    ReplicaBuilder(spark, cfg).apply("items")
    live = {r["id"]: r["v"] for r in spark.table("drill_restart.items_current").collect()}
    mismatches = len(set(live.items()) ^ set(model.items()))
    drills.record("broker_restart", {
        "records": RECORDS, "broker_restarted_mid_run": restarted,
        "committed_before_restart": committed_before, "down_seconds": DOWN_SECONDS,
        "first_run": ("recovered" if recovered else
                      f"failed: {type(first).__name__}: {str(first)[:200]}"),
        "rerun_start_offset": rerun.start_offset, "rerun_checkpoint": rerun.checkpoint_source,
        "rerun_records": rerun.records, "rerun_committed": rerun.committed_offset,
        "changelog_rows": sum(got.values()), "changelog_missing": diff["missing"],
        "changelog_duplicates": diff["duplicates"], "rows_compared": len(model) + len(live),
        "mismatches": mismatches, "seconds": round(time.monotonic() - began, 1),
    })
    print(f"\nbroker restart: first run {'recovered' if recovered else repr(first)[:300]}; "
          f"rerun from {rerun.start_offset} ({rerun.checkpoint_source}); changelog {diff}; "
          f"replica {len(live)} rows, model {len(model)}, mismatches {mismatches}")

    assert restarted, "the first run finished before the broker could be restarted"
    assert rerun.committed_offset == RECORDS
    assert diff == {"missing": 0, "unexpected": 0, "duplicates": 0}, diff
    assert mismatches == 0 and len(live) == len(model)
