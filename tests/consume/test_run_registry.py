"""A bounded run of `debezium-avro` records against the real broker and the real schema
registry (Apicurio), when the registry cannot help: a record naming a schema id it does
not know stops the partition there by default (a wrong registry or a lost store), or is
dead-lettered once the config says so; a record not in the wire format is dead-lettered
either way; and a registry that is down stops the partition at the first record it is
needed for, with what came before committed and nothing past it, so a rerun once it is
back loses nothing."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from typing import Any

import orjson
import pytest
from avro_wire import RegistryWriter, avro_value, connect_to_avro, envelope_schema, wire
from confluent_kafka import Consumer, Producer, TopicPartition

from binlog_assets.consume.errors import PartitionStopped
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.run import BoundedRun, RunSettings
from binlog_assets.consume.run_settings import RunParts
from binlog_assets.dev.kafka import KafkaBroker, create_topic
from binlog_assets.dev.registry import SchemaRegistryServer
from binlog_assets.formats import make_decoder
from binlog_assets.formats.event import SourceUnavailableError

TABLE = "shop.shop.t"
UNKNOWN_ID = 987_654_321  # far past any content id the session's registry hands out


def _schema(*columns: str) -> dict[str, Any]:
    return envelope_schema(TABLE, [{"field": c, "type": "int64", "optional": c != "id"}
                                   for c in columns])


def _record(writer: RegistryWriter, schema: dict[str, Any], row: int) -> bytes:
    """A Debezium insert of `row` in the wire format, its schema registered."""
    avro = connect_to_avro(schema)
    source = {"version": "3.4.0.Final", "connector": "mariadb", "name": "shop", "ts_ms": 1,
              "snapshot": "false", "db": "shop", "table": "t", "server_id": 1,
              "file": "mysql-bin.000001", "pos": 4 + row, "row": 0}
    columns = [f["field"] for f in schema["fields"][0]["fields"]]
    payload = {"before": None, "after": dict.fromkeys(columns, row), "source": source,
               "op": "c", "ts_ms": 1}
    return wire(writer.register(avro), avro, avro_value(schema, payload))


def _topic(broker: KafkaBroker, values: list[bytes]) -> str:
    topic = create_topic(broker.bootstrap_servers, f"avro-run-{uuid.uuid4().hex[:6]}")
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for i, value in enumerate(values):
        producer.produce(topic, key=orjson.dumps({"id": i}), value=value)
    assert producer.flush(30) == 0
    return topic


class Seen:
    """A handler that records the offsets it handled."""

    def __init__(self) -> None:
        self.offsets: list[int] = []

    def __call__(self, event: Any) -> None:
        self.offsets.append(event.offset)

    def registry(self) -> HandlerRegistry:
        reg = HandlerRegistry()
        reg.register(r".*", self, name="seen")
        return reg


def _settings(broker: KafkaBroker, group: str, registry: dict[str, Any],
              dlq: str | None = None) -> RunSettings:
    return RunSettings(
        kafka_conf={"bootstrap.servers": broker.bootstrap_servers,
                    "auto.offset.reset": "earliest"},
        group_id=group, format="debezium-avro", lanes=2, commit_interval_seconds=0.5,
        schema_registry=registry, dead_letter_topic=dlq)


def _committed(broker: KafkaBroker, group: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    try:
        return c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        c.close()


def _dead_letters(broker: KafkaBroker, topic: str, want: int) -> dict[int, dict[str, bytes]]:
    """The first `want` dead letters of `topic`, by the offset they came from."""
    c = Consumer({"bootstrap.servers": broker.bootstrap_servers,
                  "group.id": f"r-{uuid.uuid4().hex[:6]}"})
    c.assign([TopicPartition(topic, 0, 0)])
    letters: list = []
    deadline = time.monotonic() + 15
    try:
        while len(letters) < want and time.monotonic() < deadline:
            letters += [m for m in c.consume(10, timeout=0.5) if m.error() is None]
    finally:
        c.close()
    headers = [dict(m.headers()) for m in letters]
    return {int(h["binlake.offset"]): h for h in headers}


def test_an_unknown_schema_id_stops_the_partition_unless_the_config_dead_letters_it(
        kafka_broker: KafkaBroker, schema_registry: SchemaRegistryServer) -> None:
    url = schema_registry.ccompat_url
    writer = RegistryWriter(url)
    schema = _schema("id", "n")
    unknown = b"\x00" + UNKNOWN_ID.to_bytes(4, "big") + b"\x02\x04"
    topic = _topic(kafka_broker, [_record(writer, schema, 0), b'{"op": "c"}',
                                  _record(writer, schema, 2), unknown,
                                  _record(writer, schema, 4), _record(writer, schema, 5)])
    group, dlq = f"g-{uuid.uuid4().hex[:6]}", f"{topic}.dlq"
    seen = Seen()

    with pytest.raises(PartitionStopped) as stopped:
        BoundedRun(topic, 0, seen.registry(), _settings(kafka_broker, group, {"url": url}, dlq)
                   ).run()
    text = str(stopped.value)
    assert f"schema id {UNKNOWN_ID} is unknown to the schema registry at {url}" in text
    assert f"{topic}[0] stopped at offset 3, committed up to 3, nothing past it" in text
    assert "binlake.unknown.schema.id: dead-letter" in text  # what the operator can do
    assert _committed(kafka_broker, group, topic) == 3
    assert sorted(seen.offsets) == [0, 2]  # nothing past the record was handled either
    # The record not in the wire format before it was dead-lettered as always.
    assert sorted(_dead_letters(kafka_broker, dlq, 1)) == [1]

    # Once the operator decides the schemas are gone, the same run dead-letters it.
    summary = BoundedRun(topic, 0, seen.registry(), _settings(
        kafka_broker, group, {"url": url, "binlake.unknown.schema.id": "dead-letter"}, dlq)
        ).run()
    assert (summary.start_offset, summary.committed_offset) == (3, 6)
    assert summary.decode_dead_lettered == 1
    assert sorted(seen.offsets) == [0, 2, 4, 5]
    letters = _dead_letters(kafka_broker, dlq, 2)
    assert sorted(letters) == [1, 3]
    assert letters[3]["binlake.stage"] == b"decode"
    assert f"schema id {UNKNOWN_ID} is unknown".encode() in letters[3]["binlake.error"]


def _kill(server: SchemaRegistryServer) -> None:
    pid = server.running_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while server.running_pid() == pid and time.monotonic() < deadline:
        time.sleep(0.05)  # else start() finds it still alive and waits on the dying one


def test_a_registry_down_during_a_run_stops_the_partition_at_the_record_losslessly(
        kafka_broker: KafkaBroker, schema_registry: SchemaRegistryServer) -> None:
    url = schema_registry.ccompat_url
    writer = RegistryWriter(url)
    first, second = _schema("id"), _schema("id", "n")  # an ADD COLUMN at offset 3
    values = [_record(writer, first, i) for i in range(3)]
    values += [_record(writer, second, i) for i in range(3, 6)]
    topic = _topic(kafka_broker, values)
    # A run that has read the first schema before the registry went down.
    conf = {"url": url, "max.retries": 0}
    decoder = make_decoder("debezium-avro", schema_registry=conf)
    assert decoder.decode(values[0], topic=TABLE)
    group, fresh_group = f"g-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    seen = Seen()
    cannot = re.escape(f"the schema registry at {url} cannot be reached")

    _kill(schema_registry)
    try:
        with pytest.raises(SourceUnavailableError, match=cannot) as down:
            BoundedRun(topic, 0, seen.registry(), _settings(kafka_broker, group, conf),
                       RunParts(decoder=decoder)).run()
        assert f"{topic}[0] stopped at offset 3, committed up to 3, nothing past it" \
            in str(down.value)
        assert _committed(kafka_broker, group, topic) == 3
        assert sorted(seen.offsets) == [0, 1, 2]
        # A run that starts while it is down stops at its first record.
        with pytest.raises(SourceUnavailableError, match=cannot) as down:
            BoundedRun(topic, 0, HandlerRegistry(), _settings(kafka_broker, fresh_group, conf)
                       ).run()
        assert f"{topic}[0] stopped at offset 0, committed up to 0" in str(down.value)
        assert _committed(kafka_broker, fresh_group, topic) <= 0  # nothing past offset 0
    finally:
        schema_registry.start()

    # Back with its store: the same run goes on from the record it stopped at.
    summary = BoundedRun(topic, 0, seen.registry(), _settings(kafka_broker, group, conf),
                         RunParts(decoder=decoder)).run()
    assert (summary.start_offset, summary.committed_offset) == (3, 6)
    assert summary.dead_lettered == 0
    assert sorted(seen.offsets) == [0, 1, 2, 3, 4, 5]
