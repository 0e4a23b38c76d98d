"""The dev schema registry (Apicurio): it answers Confluent's client at its ccompat URL,
keeps its schemas and its id counter across a SIGKILL and a restart (an id handed out
before must name the same schema after, and a new schema must not get an old id), and
a decoder made before a restart goes on decoding after it, and the stack starts the
registry only for a `schema_registry.url` on this machine."""

from __future__ import annotations

import os
import signal
import time
import uuid

import orjson
import pytest
from avro_wire import avro_value, connect_to_avro, envelope_schema, wire
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from binlog_assets.config import parse_config
from binlog_assets.dev.registry import SchemaRegistryServer
from binlog_assets.dev.stack import local_registry, registry_wanted
from binlog_assets.formats.debezium_avro import DebeziumAvroDecoder


def _avro(name: str, *columns: str) -> str:
    return orjson.dumps({"type": "record", "name": name, "fields": [
        {"name": c, "type": "long"} for c in columns]}).decode()


def _record(client: SchemaRegistryClient, subject: str, columns: list[str]) -> bytes:
    """A Debezium insert of `columns` (all 1) in the wire format, its schema registered."""
    schema = envelope_schema("shop.shop.t", [
        {"field": c, "type": "int64", "optional": c != "id"} for c in columns])
    avro = connect_to_avro(schema)
    schema_id = client.register_schema(subject, Schema(orjson.dumps(avro).decode(), "AVRO"))
    source = {"version": "3.4.0.Final", "connector": "mariadb", "name": "shop", "ts_ms": 1,
              "snapshot": "false", "db": "shop", "table": "t", "server_id": 1,
              "file": "mysql-bin.000001", "pos": 4, "row": 0}
    payload = {"before": None, "after": dict.fromkeys(columns, 1), "source": source,
               "op": "c", "ts_ms": 1}
    return wire(schema_id, avro, avro_value(schema, payload))


def test_schemas_and_ids_survive_a_sigkill_and_restart(
        schema_registry: SchemaRegistryServer) -> None:
    subject = f"restart-{uuid.uuid4().hex[:8]}-value"
    client = SchemaRegistryClient({"url": schema_registry.ccompat_url})
    first = _avro("Row", "id")
    first_id = client.register_schema(subject, Schema(first, "AVRO"))
    assert "running" in schema_registry.status() and "ready" in schema_registry.status()
    decoder = DebeziumAvroDecoder(schema_registry={"url": schema_registry.ccompat_url})
    rows_subject = f"restart-{uuid.uuid4().hex[:8]}-rows"
    before = _record(client, rows_subject, ["id"])
    assert decoder.decode(before, topic="shop.shop.t")[0].after == {"id": 1}

    pid = schema_registry.running_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # no shutdown hook: only what was on disk survives
    deadline = time.monotonic() + 10
    while schema_registry.running_pid() == pid and time.monotonic() < deadline:
        time.sleep(0.05)  # else start() finds it still alive and waits on the dying one
    seconds = schema_registry.start()
    assert schema_registry.running_pid() not in (None, pid)
    print(f"\nschema registry restarted in {seconds:.1f}s")

    fresh = SchemaRegistryClient({"url": schema_registry.ccompat_url})  # no client cache
    assert orjson.loads(fresh.get_schema(first_id).schema_str) == orjson.loads(first)
    assert subject in fresh.get_subjects()
    assert fresh.register_schema(subject, Schema(first, "AVRO")) == first_id
    second_id = fresh.register_schema(subject, Schema(_avro("Row", "id", "n"), "AVRO"))
    assert second_id > first_id  # the counter survived too: no id is handed out twice
    # The decoder from before the restart fetches a schema registered after it.
    after = _record(fresh, rows_subject, ["id", "n"])
    assert decoder.decode(after, topic="shop.shop.t")[0].after == {"id": 1, "n": 1}
    assert decoder.decode(before, topic="shop.shop.t")[0].after == {"id": 1}


def test_the_stack_runs_a_registry_only_for_a_local_url() -> None:
    def pipeline_for(url: str | None):
        return parse_config({"schema_registry": {"url": url}} if url else {})

    local = local_registry(pipeline_for("http://127.0.0.1:18081/apis/ccompat/v7"))
    assert local is not None and local.port == 18081
    assert registry_wanted(pipeline_for("http://localhost:18081/apis/ccompat/v7/")) == "yes"
    assert local_registry(pipeline_for("https://registry.example.com/apis/ccompat/v7")) is None
    assert registry_wanted(pipeline_for(None)) == "no"
    with pytest.raises(ValueError, match=r"answers Confluent's API under /apis/ccompat/v7, "
                                         r"not at /"):
        local_registry(pipeline_for("http://127.0.0.1:18081"))
    with pytest.raises(ValueError, match="needs http:// and a port"):
        local_registry(pipeline_for("http://localhost/apis/ccompat/v7"))


def test_a_missing_build_names_the_make_target(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("BINLAKE_CACHE_DIR", str(tmp_path / "no-cache"))
    with pytest.raises(FileNotFoundError, match="run `make registry`"):
        SchemaRegistryServer(tmp_path / "registry").start()
