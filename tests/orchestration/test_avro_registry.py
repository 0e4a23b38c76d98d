"""Debezium Avro through a schema registry, in a real Dagster run on the real broker.

Records are written by confluent-kafka's AvroSerializer (which registers their schemas)
in the registry's wire format, with a bad one of each kind among them. The registry
wants a password, which binlake's config names by an environment variable, so it is
`avro_wire.SchemaRegistry` (the Confluent REST API over real HTTP, a test fake): the
real registry of the stack (Apicurio 2.x) authenticates only through an OIDC server,
which does not run here. The decoding itself is tested on the real registry in
tests/formats/test_debezium_avro.py and tests/drills/test_e2e_avro.py. A run decodes the
good records into the changelog with their types, dead-letters the bad ones with their
coordinates (an unknown schema id only where the config says so), and leaves the
password out of everything it records; with the registry gone, the run fails at once,
naming it. On the real registry, a record naming an unknown schema id stops its
partition there by default while the run's other partitions go on.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import dagster as dg
import orjson
import pytest
import yaml
from avro_wire import (
    RegistryWriter,
    SchemaRegistry,
    avro_value,
    connect_to_avro,
    envelope_schema,
    wire,
)
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable
from run_records import dead_letters, recorded_texts

from binlog_assets.dev.kafka import KafkaBroker, create_topic
from binlog_assets.dev.registry import SchemaRegistryServer
from binlog_assets.orchestration.changelog_asset import changelog
from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME, partition_key
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import RANGE_END_TAG, RANGE_START_TAG

PASSWORD_ENV = "BINLAKE_TEST_REGISTRY_PASSWORD"
PASSWORD = f"reg-{uuid.uuid4().hex}"  # unique, so a grep cannot match anything else
USER = "binlake-reader"
TABLE = "shop.shop.orders"
ROW = [{"field": "id", "type": "int64", "optional": False},
       {"field": "price", "type": "bytes", "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "2", "connect.decimal.precision": "10"}},
       {"field": "placed", "type": "int64", "optional": True,
        "name": "io.debezium.time.Timestamp"}]
KEY = {"type": "struct", "name": f"{TABLE}.Key", "fields": [ROW[0]]}


@pytest.fixture
def registry():
    with SchemaRegistry(user_info=f"{USER}:{PASSWORD}") as running:
        yield running


def _produce(broker: KafkaBroker, registry: SchemaRegistry) -> str:
    topic = create_topic(broker.bootstrap_servers, f"avro-{uuid.uuid4().hex[:6]}")
    client = SchemaRegistryClient({"url": registry.url,
                                   "basic.auth.user.info": f"{USER}:{PASSWORD}"})
    schema = envelope_schema(TABLE, ROW)
    values = AvroSerializer(client, orjson.dumps(connect_to_avro(schema)).decode())
    keys = AvroSerializer(client, orjson.dumps(connect_to_avro(KEY)).decode())
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for i in range(5):
        payload = {"before": None, "op": "c", "ts_ms": i,
                   "after": {"id": i, "price": "MDk=", "placed": 1_700_000_000_000 + i},
                   "source": {"version": "3.4.0.Final", "connector": "mariadb", "name": "shop",
                              "ts_ms": i, "snapshot": "false", "db": "shop",
                              "table": "orders", "server_id": 1, "file": "mysql-bin.000001",
                              "pos": 100 + i, "row": 0}}
        producer.produce(
            topic,
            key=keys({"id": i}, SerializationContext(topic, MessageField.KEY)),
            value=values(avro_value(schema, payload),
                         SerializationContext(topic, MessageField.VALUE)))
    producer.produce(topic, key=b"k5", value=b'{"op": "c"}')  # not the wire format
    producer.produce(topic, key=b"k6", value=b"\x00\x00\x00\x30\x39rest")  # schema id 12345
    assert producer.flush(30) == 0
    return topic


def _config(broker: KafkaBroker, registry: SchemaRegistry, topic: str, tmp_path: Path,
            **settings: str) -> Path:
    pipeline = {
        "kafka": {"bootstrap.servers": broker.bootstrap_servers,
                  "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"},
        "schema_registry": {"url": registry.url,
                            "basic.auth.user.info": USER + ":${" + PASSWORD_ENV + "}",
                            **settings},
        "lakehouse": {"path": str(tmp_path / "lake"), "database": "avro"},
        "sources": [{"name": "shop_avro", "topics": [topic], "format": "debezium-avro"}],
    }
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline))
    return path


def _run(path: Path, key: str, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    return dg.materialize([changelog], partition_key=key, instance=instance,
                          raise_on_error=False,
                          resources={"binlake": BinlakeResource(config_path=str(path))})


def test_avro_records_reach_the_changelog_and_bad_ones_are_dead_lettered(
        kafka_broker: KafkaBroker, registry: SchemaRegistry, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    topic = _produce(kafka_broker, registry)
    # The operator has decided the schemas of unknown ids are gone: they are dead-lettered.
    path = _config(kafka_broker, registry, topic, tmp_path,
                   **{"binlake.unknown.schema.id": "dead-letter"})
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    assert PASSWORD not in path.read_text()
    key = partition_key(topic, 0)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, [key])
        result = _run(path, key, instance)
        assert result.success
        (mat,) = result.asset_materializations_for_node("changelog")
        assert (mat.metadata["records"].value, mat.metadata["dead_lettered"].value) == (7, 2)
        assert mat.metadata["committed_offset"].value == 7
        recorded = recorded_texts(instance, result.run_id)
        assert recorded and not [r for r in recorded if PASSWORD in r]

    table = DeltaTable(str(tmp_path / "lake" / "warehouse" / "avro.db" / "changelog"))
    rows = table.to_pyarrow_table(
        columns=["offset", "table", "op", "key", "after", "column_types"]).to_pylist()
    assert [(r["offset"], r["table"], r["op"]) for r in sorted(rows, key=lambda r: r["offset"])] \
        == [(i, "shop.orders", "c") for i in range(5)]
    first = min(rows, key=lambda r: r["offset"])
    assert orjson.loads(first["column_types"]) == {
        "id": "bigint", "price": "decimal(10,2)", "placed": "timestamp"}
    assert orjson.loads(first["after"])["price"] == "123.45"

    msgs = dead_letters(kafka_broker.bootstrap_servers, "binlake.dlq.shop_avro")
    found = {dict(m.headers())["binlake.offset"]: dict(m.headers()) for m in msgs
             if dict(m.headers())["binlake.topic"] == topic.encode()}
    assert sorted(found) == [b"5", b"6"]
    assert b"magic byte 0x00" in found[b"5"]["binlake.error"]
    assert b"schema id 12345 is unknown" in found[b"6"]["binlake.error"]


def test_an_unreachable_registry_fails_the_run_at_once_and_names_it(
        kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with SchemaRegistry(user_info=f"{USER}:{PASSWORD}") as registry:
        topic = _produce(kafka_broker, registry)
        path = _config(kafka_broker, registry, topic, tmp_path)
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    key = partition_key(topic, 0)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, [key])
        began = time.monotonic()
        result = _run(path, key, instance)
        seconds = time.monotonic() - began
        assert not result.success
        error = result.get_step_failure_events()[0].step_failure_data.error
        text = error.to_string()
        assert "SourceUnavailableError" in text
        assert f"the schema registry at {registry.url} cannot be reached" in text
        assert PASSWORD not in text
        assert seconds < 30, seconds
        # Nothing was dead-lettered or committed behind the outage.
        assert not result.asset_materializations_for_node("changelog")


def test_an_unknown_schema_id_stops_its_partition_and_the_others_go_on(
        kafka_broker: KafkaBroker, schema_registry: SchemaRegistryServer,
        tmp_path: Path) -> None:
    writer = RegistryWriter(schema_registry.ccompat_url)
    schema = envelope_schema(TABLE, ROW[:1])
    avro = connect_to_avro(schema)
    schema_id = writer.register(avro)
    topic = create_topic(kafka_broker.bootstrap_servers, f"avro-{uuid.uuid4().hex[:6]}", 2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    for partition in (0, 1):
        for i in range(4):
            payload = {"before": None, "op": "c", "ts_ms": i, "after": {"id": i},
                       "source": {"version": "3.4.0.Final", "connector": "mariadb",
                                  "name": "shop", "ts_ms": i, "snapshot": "false",
                                  "db": "shop", "table": "orders", "server_id": 1,
                                  "file": "mysql-bin.000001", "pos": 100 + i, "row": 0}}
            value = wire(schema_id, avro, avro_value(schema, payload))
            if (partition, i) == (0, 2):
                value = b"\x00" + (987_654_321).to_bytes(4, "big") + value[5:]
            producer.produce(topic, partition=partition, key=orjson.dumps({"id": i}),
                             value=value)
    assert producer.flush(30) == 0
    pipeline = {
        "kafka": {"bootstrap.servers": kafka_broker.bootstrap_servers,
                  "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"},
        "schema_registry": {"url": schema_registry.ccompat_url},
        "lakehouse": {"path": str(tmp_path / "lake"), "database": "avro"},
        "sources": [{"name": "shop_avro", "topics": [topic], "format": "debezium-avro"}],
    }
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline))
    keys = [partition_key(topic, 0), partition_key(topic, 1)]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, keys)
        result = dg.materialize(
            [changelog], instance=instance, raise_on_error=False,
            resources={"binlake": BinlakeResource(config_path=str(path))},
            tags={RANGE_START_TAG: keys[0], RANGE_END_TAG: keys[1]})
        assert not result.success
        text = result.get_step_failure_events()[0].step_failure_data.error.to_string()
        assert "1 of 2 partitions failed" in text
        assert (f"schema id 987654321 is unknown to the schema registry at "
                f"{schema_registry.ccompat_url}") in text
        assert f"{topic}[0] stopped at offset 2, committed up to 2, nothing past it" in text

    table = DeltaTable(str(tmp_path / "lake" / "warehouse" / "avro.db" / "changelog"))
    rows = table.to_pyarrow_table(columns=["partition", "offset"]).to_pylist()
    assert sorted((r["partition"], r["offset"]) for r in rows) == [
        (0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (1, 3)]
    msgs = dead_letters(kafka_broker.bootstrap_servers, "binlake.dlq.shop_avro")
    assert not [m for m in msgs if dict(m.headers())["binlake.topic"] == topic.encode()]
