"""A secured cluster: the embedded broker with a SASL_PLAINTEXT listener (SCRAM-SHA-512),
and binlake's config naming its password by an environment variable.

A bounded consumer run (with a dead letter, so the dead-letter producer authenticates
too) and the lag sensor run against it; nothing of the password reaches the run's event
log, tags or errors; and a wrong password fails the run and the sensor at once, with an
authentication error that says so.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import dagster as dg
import orjson
import pytest
import yaml
from confluent_kafka import Producer
from run_records import dead_letters, recorded_texts

from binlog_assets.consume.preflight import KafkaAuthenticationError
from binlog_assets.dev.kafka import KafkaBroker, create_topic
from binlog_assets.orchestration.changelog_asset import changelog
from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME, partition_key
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.sensors import kafka_lag_sensor

PASSWORD_ENV = "BINLAKE_TEST_KAFKA_PASSWORD"
PASSWORD = f"pw-{uuid.uuid4().hex}"  # unique, so a grep cannot match anything else
USER = "binlake-runner"


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory):
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka-sasl"), scram_users={USER: PASSWORD},
                         c1=True)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def _debezium(i: int) -> bytes:
    return orjson.dumps({"before": None, "after": {"id": i}, "op": "c", "ts_ms": i,
                         "source": {"db": "d", "table": "t", "file": "mysql-bin.000001",
                                    "pos": 100 + i, "row": 0, "snapshot": "false"}})


def _setup(broker: KafkaBroker, tmp_path: Path) -> tuple[str, Path]:
    topic = create_topic(broker.bootstrap_servers, "secured")
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for i in range(5):
        producer.produce(topic, key=orjson.dumps({"id": i}), value=_debezium(i))
    producer.produce(topic, key=b"bad", value=b"{not json")  # dead-lettered
    assert producer.flush(30) == 0
    pipeline = {
        "kafka": {"bootstrap.servers": broker.sasl_bootstrap_servers,
                  "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-512",
                  "sasl.username": USER, "sasl.password": "${" + PASSWORD_ENV + "}",
                  "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"},
        "lakehouse": {"path": str(tmp_path / "lake"), "database": "secured"},
        "dagster": {"lag_threshold": 1},
        "sources": [{"name": "sec", "topics": [topic], "format": "debezium"}],
    }
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline))
    return topic, path


def test_runs_and_sensors_authenticate_with_a_password_from_the_environment(
        sasl_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    topic, path = _setup(sasl_broker, tmp_path)
    key = partition_key(topic, 0)
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    assert PASSWORD not in path.read_text()
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, [key])
        result = dg.materialize([changelog], partition_key=key, instance=instance,
                                resources={"binlake": BinlakeResource(config_path=str(path))})
        assert result.success
        (mat,) = result.asset_materializations_for_node("changelog")
        assert (mat.metadata["records"].value, mat.metadata["dead_lettered"].value) == (6, 1)
        assert mat.metadata["committed_offset"].value == 6

        # The secret is nowhere in what the run recorded: events, metadata, tags, logs.
        recorded = recorded_texts(instance, result.run_id)
        assert recorded and not [r for r in recorded if PASSWORD in r]

        # The lag sensor authenticates too: new records, one run requested.
        producer = Producer({"bootstrap.servers": sasl_broker.bootstrap_servers})
        producer.produce(topic, key=b"7", value=_debezium(7))
        assert producer.flush(30) == 0
        tick = kafka_lag_sensor(dg.build_sensor_context(
            instance=instance, resources={"binlake": BinlakeResource(config_path=str(path))}))
        assert [r.partition_key for r in tick.run_requests] == [key]
        assert PASSWORD not in repr(tick)

    # The dead letter went out through the secured listener, with its coordinates.
    msgs = dead_letters(sasl_broker.bootstrap_servers, "binlake.dlq.sec")
    assert [m.value() for m in msgs] == [b"{not json"]
    headers = dict(msgs[0].headers())
    assert (headers["binlake.topic"], headers["binlake.offset"]) == (topic.encode(), b"5")


def test_a_wrong_password_fails_the_run_and_the_sensor_at_once_and_says_why(
        sasl_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    topic, path = _setup(sasl_broker, tmp_path)
    key = partition_key(topic, 0)
    wrong = f"wrong-{uuid.uuid4().hex}"
    monkeypatch.setenv(PASSWORD_ENV, wrong)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, [key])
        began = time.monotonic()
        result = dg.materialize([changelog], partition_key=key, instance=instance,
                                raise_on_error=False,
                                resources={"binlake": BinlakeResource(config_path=str(path))})
        seconds = time.monotonic() - began
        assert not result.success
        error = result.get_step_failure_events()[0].step_failure_data.error.cause
        assert error.cls_name == "KafkaAuthenticationError"
        assert f"Kafka authentication failed for {sasl_broker.sasl_bootstrap_servers} " \
               f"(SASL_PLAINTEXT SCRAM-SHA-512) as {USER}" in error.message
        assert wrong not in error.to_string()
        assert seconds < 15, seconds  # not a metadata timeout, nor polls until the end

        began = time.monotonic()
        with pytest.raises(KafkaAuthenticationError, match="invalid credentials"):
            kafka_lag_sensor(dg.build_sensor_context(
                instance=instance,
                resources={"binlake": BinlakeResource(config_path=str(path))}))
        assert time.monotonic() - began < 10
