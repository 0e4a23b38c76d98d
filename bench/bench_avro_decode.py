"""Avro decode: Debezium records through a schema registry's wire format vs the same
records from the JSON converter (schema block included), decoded by binlake.

`--records` (default 200,000) change events of one typical table (bigint key, int,
enum, DECIMAL(10,2), DATETIME, optional VARCHAR, propagated source types; 20% c / 60% u
/ 20% d with before-images), written once as the JSON converter writes them and once
as an Avro converter does (Confluent wire format: magic byte, schema id, Avro binary;
the schema in the shape registries hold). Each side is decoded by its decoder
(`debezium`, `debezium-avro`) in one loop, no Kafka: what the format costs per record.
The registry is an in-process dict answering `get_schema` (the decoder asks once per
schema id; HTTP is not what is measured). Both sides must give equal events.
Printed: records/s of each and Avro / JSON (higher is faster; no target).

    .venv/bin/python bench/bench_avro_decode.py
"""

from __future__ import annotations

import argparse
import base64
import io
import random
import statistics
import struct
import time
from decimal import Decimal
from typing import Any

import fastavro
import orjson
from confluent_kafka.schema_registry import Schema
from harness import load_average, rate

from binlog_assets.formats.debezium import DebeziumDecoder
from binlog_assets.formats.debezium_avro import DebeziumAvroDecoder

TOPIC = "bench.shop.orders"
SCHEMA_ID = 1


def _source_type(kind: str, length: int | None = None) -> dict[str, str]:
    out = {"__debezium.source.column.type": kind}
    if length is not None:
        out["__debezium.source.column.length"] = str(length)
    return out


# (column, Connect type, optional, logical name, parameters, Avro type)
COLUMNS: list[tuple[str, str, bool, str | None, dict, Any]] = [
    ("id", "int64", False, None, _source_type("BIGINT", 20), "long"),
    ("customer_id", "int32", False, None, _source_type("INT", 11), "int"),
    ("status", "string", False, "io.debezium.data.Enum",
     {"allowed": "new,paid,shipped", **_source_type("ENUM", 1)}, "string"),
    ("amount", "bytes", True, "org.apache.kafka.connect.data.Decimal",
     {"scale": "2", "connect.decimal.precision": "10", **_source_type("DECIMAL", 10)},
     {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}),
    ("placed", "int64", False, "io.debezium.time.Timestamp", _source_type("DATETIME"),
     "long"),
    ("note", "string", True, None, _source_type("VARCHAR", 80), "string"),
]


def connect_schema() -> dict[str, Any]:
    fields = []
    for column, kind, optional, name, parameters, _ in COLUMNS:
        field = {"field": column, "type": kind, "optional": optional, "parameters": parameters}
        if name:
            field["name"] = name
        fields.append(field)
    row = {"type": "struct", "name": f"{TOPIC}.Value", "optional": True, "fields": fields}
    source = {"type": "struct", "name": "io.debezium.connector.mariadb.Source",
              "field": "source", "optional": False, "fields": [
                  {"field": f, "type": t, "optional": False} for f, t in (
                      ("db", "string"), ("table", "string"), ("file", "string"),
                      ("pos", "int64"), ("row", "int32"), ("ts_ms", "int64"))]}
    return {"type": "struct", "name": f"{TOPIC}.Envelope", "fields": [
        {**row, "field": "before"}, {**row, "field": "after"}, source,
        {"field": "op", "type": "string", "optional": False}]}


def avro_schema() -> dict[str, Any]:
    fields = []
    for column, kind, optional, name, parameters, avro in COLUMNS:
        spec = dict(avro) if isinstance(avro, dict) else {"type": avro}
        spec["connect.parameters"] = parameters
        if name:
            spec["connect.name"] = name
        if kind in ("int8", "int16"):
            spec["connect.type"] = kind
        fields.append({"name": column, "type": ["null", spec] if optional else spec,
                       **({"default": None} if optional else {})})
    return {"type": "record", "name": "Envelope", "namespace": TOPIC, "fields": [
        {"name": "before", "type": ["null", {"type": "record", "name": "Value",
                                             "fields": fields}], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": {"type": "record", "name": "Source",
                                    "namespace": "io.debezium.connector.mariadb",
                                    "fields": [{"name": f, "type": t} for f, t in (
                                        ("db", "string"), ("table", "string"),
                                        ("file", "string"), ("pos", "long"), ("row", "int"),
                                        ("ts_ms", "long"))]}},
        {"name": "op", "type": "string"}]}


class DictRegistry:
    """`get_schema` by id from a dict: what the decoder asks of a registry client."""

    def __init__(self, schemas: dict[int, str]) -> None:
        self.schemas = schemas

    def get_schema(self, schema_id: int, subject_name: str | None = None,
                   fmt: str | None = None, reference_format: str | None = None) -> Schema:
        return Schema(self.schemas[schema_id], "AVRO")


def records(n: int, seed: int) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    """(key, value) pairs of both formats for `n` changes over n / 5 keys."""
    rng = random.Random(seed)
    schema = connect_schema()
    parsed = fastavro.parse_schema(avro_schema())
    live: dict[int, dict[str, Any]] = {}
    as_json, as_avro = [], []
    for i in range(n):
        ident = rng.randrange(max(1, n // 5))
        before = live.get(ident)
        op = "c" if before is None else "d" if rng.random() < 0.25 else "u"
        after = None if op == "d" else {
            "id": ident, "customer_id": rng.randrange(10_000),
            "status": rng.choice(("new", "paid", "shipped")),
            "amount": Decimal(rng.randrange(1, 10_000_000)).scaleb(-2),
            "placed": 1_700_000_000_000 + i * 1000, "note": rng.choice((None, "gift wrap"))}
        if after is None:
            live.pop(ident)
        else:
            live[ident] = after
        source = {"db": "shop", "table": "orders", "file": "mysql-bin.000003",
                  "pos": 4 + i * 100, "row": 0, "ts_ms": 1_700_000_000_000 + i}
        payload = {"before": before, "after": after, "source": source, "op": op}
        key = {"id": ident}
        as_json.append((orjson.dumps(key), orjson.dumps(
            {"schema": schema, "payload": payload}, default=_json_value)))
        out = io.BytesIO()
        out.write(struct.pack(">bI", 0, SCHEMA_ID))
        fastavro.schemaless_writer(out, parsed, payload)
        as_avro.append((orjson.dumps(key), out.getvalue()))
    return as_json, as_avro


def _json_value(value: Any) -> Any:
    # The JSON converter's precise decimal: the unscaled value's bytes, base64.
    unscaled = int(value.scaleb(2))
    raw = unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)
    return base64.b64encode(raw).decode()


def decode_all(decoder: Any, pairs: list[tuple[bytes, bytes]]) -> tuple[float, list]:
    began = time.perf_counter()
    events = []
    for offset, (key, value) in enumerate(pairs):
        events += decoder.decode(value, topic=TOPIC, partition=0, offset=offset, key=key)
    return time.perf_counter() - began, events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    as_json, as_avro = records(args.records, args.seed)
    registry = DictRegistry({SCHEMA_ID: orjson.dumps(avro_schema()).decode()})
    json_size = statistics.mean(len(v) for _, v in as_json)
    avro_size = statistics.mean(len(v) for _, v in as_avro)
    print(f"{args.records:,} records: JSON mean {json_size:,.0f} B, Avro mean "
          f"{avro_size:,.0f} B; {load_average()}", flush=True)
    json_s, avro_s = [], []
    for _ in range(args.rounds):  # interleaved, a fresh decoder (cold caches) each time
        seconds, json_events = decode_all(DebeziumDecoder(), as_json)
        json_s.append(seconds)
        seconds, avro_events = decode_all(DebeziumAvroDecoder(client=registry), as_avro)
        avro_s.append(seconds)
        if avro_events != json_events:
            raise SystemExit("Avro and JSON decode to different events")
    json_best, avro_best = min(json_s), min(avro_s)
    print(f"JSON (schema block): best {json_best:.2f}s, {rate(args.records, json_best):,.0f} "
          f"records/s")
    print(f"Avro (wire format):  best {avro_best:.2f}s, {rate(args.records, avro_best):,.0f} "
          f"records/s")
    print(f"Avro / JSON records/s = {json_best / avro_best:.2f}; events equal on both sides; "
          f"{load_average()}")


if __name__ == "__main__":
    main()
