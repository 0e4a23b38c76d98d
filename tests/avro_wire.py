"""Debezium records in Avro for tests: a Connect schema as Confluent's AvroData writes it,
a JSON payload's values as Avro values, the registry's wire format, a writer that
registers schemas in the real registry (Apicurio, the `schema_registry` fixture) as a
producer's serializer does, and a counting client.

`SchemaRegistry` is a small fake of the Confluent REST API (register and by-id lookups,
over real HTTP, with optional basic auth). It remains only for the credential tests:
Apicurio 2.x authenticates through an OIDC server, which does not run here, so a
password from `${ENV}` and a refused one can only be checked against the fake.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import threading
import uuid
from collections.abc import Mapping
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import fastavro
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

_AVRO_PRIMITIVES = {"int8": "int", "int16": "int", "int32": "int", "int64": "long",
                    "float32": "float", "float64": "double", "float": "float",
                    "double": "double", "boolean": "boolean", "string": "string",
                    "bytes": "bytes"}
# Connect's own logical types, which AvroData also marks with an Avro logicalType.
_CONNECT_LOGICAL = {"org.apache.kafka.connect.data.Date": "date",
                    "org.apache.kafka.connect.data.Time": "time-millis",
                    "org.apache.kafka.connect.data.Timestamp": "timestamp-millis"}
_DECIMAL = "org.apache.kafka.connect.data.Decimal"


def connect_to_avro(schema: Mapping[str, Any], seen: set[str] | None = None) -> Any:
    """The Avro schema AvroData makes of a Connect schema (its JSON converter form)."""
    seen = set() if seen is None else seen
    kind = schema["type"]
    name = schema.get("name")
    if kind == "struct":
        full = name or "ConnectDefault"
        if full in seen:
            avro: Any = full  # a named type is defined once, then referenced
        else:
            seen.add(full)
            namespace, _, short = full.rpartition(".")
            avro = {"type": "record", "name": short, "fields": [
                _avro_field(f, seen) for f in schema.get("fields", [])]}
            if namespace:
                avro["namespace"] = namespace
            if name:
                avro["connect.name"] = name
    elif kind == "array":
        avro = {"type": "array", "items": _nullable(schema["items"], seen)}
    elif kind == "map":
        avro = {"type": "map", "values": _nullable(schema["values"], seen)}
    else:
        avro = {"type": _AVRO_PRIMITIVES[kind]}
        if kind in ("int8", "int16"):
            avro["connect.type"] = kind
        if name:
            avro["connect.version"] = 1
            avro["connect.name"] = name
        if schema.get("parameters"):
            avro["connect.parameters"] = dict(schema["parameters"])
        if name == _DECIMAL:
            parameters = schema.get("parameters") or {}
            avro["logicalType"] = "decimal"
            avro["scale"] = int(parameters.get("scale", 0))
            avro["precision"] = int(parameters.get("connect.decimal.precision", 64))
        elif name in _CONNECT_LOGICAL:
            avro["logicalType"] = _CONNECT_LOGICAL[name]
        if len(avro) == 1:
            avro = avro["type"]
    return avro


def _nullable(schema: Mapping[str, Any], seen: set[str]) -> Any:
    avro = connect_to_avro(schema, seen)
    return ["null", avro] if schema.get("optional") else avro


def _avro_field(field: Mapping[str, Any], seen: set[str]) -> dict[str, Any]:
    avro = _nullable(field, seen)
    if field.get("optional"):
        return {"name": field["field"], "type": avro, "default": None}
    return {"name": field["field"], "type": avro}


def avro_value(schema: Mapping[str, Any], value: Any) -> Any:
    """A JSON-converter value as the Avro writer takes it (base64 bytes and decimals
    become bytes and Decimals; structs recurse)."""
    if value is None:
        return None
    if schema["type"] == "struct":
        return {f["field"]: avro_value(f, value.get(f["field"])) for f in schema["fields"]}
    if schema["type"] == "array":
        return [avro_value(schema["items"], v) for v in value]
    if schema["type"] == "map":
        return {k: avro_value(schema["values"], v) for k, v in value.items()}
    if schema.get("name") == _DECIMAL:
        raw = base64.b64decode(value)
        scale = int((schema.get("parameters") or {}).get("scale", 0))
        # From text: scaleb would round to the context's 28 digits.
        return Decimal(f"{int.from_bytes(raw, 'big', signed=True)}E-{scale}")
    if schema["type"] == "bytes":
        return base64.b64decode(value)
    return value


def wire(schema_id: int, avro_schema: Any, value: Any) -> bytes:
    """Magic byte 0, the schema id, then the Avro binary of `value`."""
    out = io.BytesIO()
    out.write(struct.pack(">bI", 0, schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(avro_schema), value)
    return out.getvalue()


def source_schema() -> dict[str, Any]:
    """The `source` block's Connect schema, as the MariaDB connector declares it."""
    def f(column: str, kind: str, optional: bool = False, **more: Any) -> dict[str, Any]:
        return {"field": column, "type": kind, "optional": optional, **more}

    return {"type": "struct", "name": "io.debezium.connector.mariadb.Source", "field": "source",
            "optional": False, "fields": [
                f("version", "string"), f("connector", "string"), f("name", "string"),
                f("ts_ms", "int64"),
                f("snapshot", "string", True, name="io.debezium.data.Enum",
                  parameters={"allowed": "true,first,first_in_data_collection,"
                                          "last_in_data_collection,last,false,incremental"}),
                f("db", "string"), f("sequence", "string", True), f("table", "string", True),
                f("server_id", "int64"), f("gtid", "string", True), f("file", "string"),
                f("pos", "int64"), f("row", "int32"), f("thread", "int64", True),
                f("query", "string", True)]}


def envelope_schema(table: str, row_fields: list[dict[str, Any]]) -> dict[str, Any]:
    """The Connect schema of a Debezium envelope for `table` (`prefix.db.table`)."""
    row = {"type": "struct", "name": f"{table}.Value", "optional": True, "fields": row_fields}
    return {"type": "struct", "name": f"{table}.Envelope", "optional": False, "fields": [
        {**row, "field": "before"}, {**row, "field": "after"}, source_schema(),
        {"field": "op", "type": "string", "optional": False},
        {"field": "ts_ms", "type": "int64", "optional": True}]}


class RegistryWriter:
    """Registers Avro schemas in a real registry under one subject of its own, with
    Confluent's client at the registry's ccompat `url`, and returns their ids."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = SchemaRegistryClient({"url": url})
        self.subject = f"test-{uuid.uuid4().hex[:10]}-value"
        self.ids: set[int] = set()

    def register(self, avro_schema: Any) -> int:
        schema_id = self.client.register_schema(
            self.subject, Schema(json.dumps(avro_schema), "AVRO"))
        self.ids.add(schema_id)
        return schema_id


class CountingClient(SchemaRegistryClient):
    """Confluent's client, counting the schema fetches a decoder asks it for."""

    def __init__(self, conf: dict[str, Any]) -> None:
        super().__init__(conf)
        self.fetched: list[int] = []

    def get_schema(self, schema_id: int, *args: Any, **kwargs: Any) -> Any:
        self.fetched.append(schema_id)
        return super().get_schema(schema_id, *args, **kwargs)


class SchemaRegistry:
    """A fake schema registry on loopback: POST /subjects/<s>/versions registers, GET
    /schemas/ids/<id> answers, and every request needs `user:password` when set."""

    def __init__(self, user_info: str | None = None) -> None:
        self.user_info = user_info
        self.schemas: dict[int, str] = {}
        self.requests: list[str] = []
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet test output
                pass

            def do_GET(self) -> None:
                registry._answer(self, "GET")

            def do_POST(self) -> None:
                registry._answer(self, "POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> SchemaRegistry:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def register(self, avro_schema: Any) -> int:
        text = json.dumps(avro_schema)
        for schema_id, known in self.schemas.items():
            if known == text:
                return schema_id
        schema_id = len(self.schemas) + 1
        self.schemas[schema_id] = text
        return schema_id

    def _answer(self, request: BaseHTTPRequestHandler, method: str) -> None:
        path = request.path.split("?", 1)[0]
        self.requests.append(f"{method} {path}")
        if self.user_info is not None:
            expected = "Basic " + base64.b64encode(self.user_info.encode()).decode()
            if request.headers.get("Authorization") != expected:
                return self._reply(request, 401, {"error_code": 40101,
                                                  "message": "Unauthorized"})
        parts = path.strip("/").split("/")
        if method == "GET" and parts[:2] == ["schemas", "ids"] and len(parts) == 3:
            text = self.schemas.get(int(parts[2]))
            if text is None:
                return self._reply(request, 404, {"error_code": 40403,
                                                  "message": "Schema not found"})
            return self._reply(request, 200, {"schema": text})
        if method == "POST" and parts[0] == "subjects" and parts[-1] == "versions":
            length = int(request.headers.get("Content-Length") or 0)
            body = json.loads(request.rfile.read(length) or b"{}")
            return self._reply(request, 200, {"id": self.register(json.loads(body["schema"]))})
        self._reply(request, 404, {"error_code": 404, "message": f"no route {path}"})

    @staticmethod
    def _reply(request: BaseHTTPRequestHandler, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)
