"""Debezium writes the seeded MariaDB workload in Avro, through a schema registry, and
binlake reads only that: every replica equals its source table, and every row event
equals the one the JSON converter gave for the same binlog position.

A second connector joins the session's Kafka Connect worker with Apicurio's Avro
converter (from Maven Central) for keys and values, in the Confluent wire format
(`as-confluent`, content ids). It registers its schemas through Apicurio's own API in
the session's Apicurio Registry (the `schema_registry` fixture, a real server); binlake's
`debezium-avro` source fetches them by id with confluent-kafka's client at the same
registry's Confluent-compatible URL (`/apis/ccompat/v7`).
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from typing import Any

import orjson
from avro_wire import CountingClient
from drill_lib import (
    PREFIX,
    REPLICAS,
    TABLES,
    TOPICS,
    kafka_events,
    wait_published,
    workload,
)

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.dev import drills, shop
from binlog_assets.dev.connect import DebeziumConnector, DebeziumFence, KafkaConnect
from binlog_assets.dev.demo import wait_for_debezium
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.dev.registry import SchemaRegistryServer
from binlog_assets.formats.debezium import DebeziumDecoder
from binlog_assets.formats.debezium_avro import DebeziumAvroDecoder
from binlog_assets.formats.event import OP_DDL, ChangeEvent
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.orchestration.partitions import partition_key
from binlog_assets.rounds.round import consume_partition

SEED = 20261124
STATEMENTS = 300


def _same_change(event: ChangeEvent) -> tuple:
    return (event.table, event.op, event.position, event.key, event.ddl)


def _content(event: ChangeEvent) -> tuple:
    return (event.key_columns, event.before, event.after, event.column_types,
            event.source_ts)


class _Timed:
    """A decoder whose decode() time is summed: the decode rate without Kafka's reads."""

    def __init__(self, decoder: Any) -> None:
        self.decoder, self.seconds, self.records = decoder, 0.0, 0

    def decode(self, *args: Any, **kwargs: Any) -> list[ChangeEvent]:
        began = time.perf_counter()
        try:
            return self.decoder.decode(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - began
            self.records += 1

    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


def _subjects(registry: SchemaRegistryServer, prefix: str) -> list[str]:
    with urllib.request.urlopen(registry.ccompat_url + "/subjects", timeout=10) as response:
        return sorted(s for s in orjson.loads(response.read()) if s.startswith(prefix))


def test_debezium_s_avro_converter_through_a_registry(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, debezium_fence: DebeziumFence,
    pipeline_config: PipelineConfig,
    schema_registry: SchemaRegistryServer, spark,
) -> None:
    """Debezium itself writes Avro: a second connector in the session's worker, with
    Apicurio's converter (the Confluent wire format, keys and values) registering its
    schemas in the real registry; binlake reads only its topics."""
    kafka_conf = dict(pipeline_config.kafka)
    prefix = f"avro{uuid.uuid4().hex[:4]}"
    registry_conf = {"url": schema_registry.ccompat_url}
    converter = {
        f"{side}.converter": "io.apicurio.registry.utils.converter.AvroConverter"
        for side in ("key", "value")}
    for side in ("key", "value"):
        converter |= {
            f"{side}.converter.apicurio.registry.url": schema_registry.apicurio_url,
            f"{side}.converter.apicurio.registry.auto-register": "true",
            f"{side}.converter.apicurio.registry.as-confluent": "true",
            f"{side}.converter.apicurio.registry.use-id": "contentId",
            f"{side}.converter.apicurio.registry.headers.enabled": "false"}
    connector = DebeziumConnector.for_server(
        mariadb, name=prefix, topic_prefix=prefix, server_id=184057,
        snapshot_mode="no_data", extra=converter)
    debezium_connect.add_connector(connector)
    try:
        statements = workload(mariadb.connect(), SEED, STATEMENTS)
        topics = [prefix + t[len(PREFIX):] for t in TOPICS]
        ends = wait_for_debezium(kafka_conf, topics, fence=DebeziumFence(
            debezium_connect, mariadb, connector.name))
    finally:
        debezium_connect.remove_connector(connector.name)
    data = pipeline_config.model_dump(mode="json", exclude_none=True)
    data["kafka"]["group.id"] = f"e2e-avroconv-{uuid.uuid4().hex[:6]}"
    data["lakehouse"] = {**data["lakehouse"], "database": "e2e_avro_converter"}
    data["schema_registry"] = registry_conf
    data["sources"] = [{"name": "shop_avro", "topics": topics, "format": "debezium-avro",
                        "tables": TABLES}]
    pipeline = parse_config(data)
    summaries = [consume_partition(pipeline, dict(pipeline.kafka), partition_key(t, 0),
                                   ChangelogRunConfig(), HandlerRegistry(),
                                   group=pipeline.kafka["group.id"])[0] for t in topics]
    # The session's JSON connector read the same binlog: each Avro row event must
    # equal the JSON event at its position, values and types alike. (Schema-change
    # events are each connector's own: it lists the tables its history holds, and
    # this connector's history began at its start.)
    json_decoder = _Timed(DebeziumDecoder())
    json_side = {_same_change(e): e for e in kafka_events(
        kafka_conf, wait_published(kafka_conf, debezium_fence), json_decoder)}
    client = CountingClient(registry_conf)
    avro_decoder = _Timed(DebeziumAvroDecoder(schema_registry=registry_conf, client=client))
    avro_side = [e for e in kafka_events(kafka_conf, ends, avro_decoder) if e.op != OP_DDL]
    cold_rate = avro_decoder.rate()
    # Again with every schema cached: the steady state of a long run.
    avro_decoder.seconds, avro_decoder.records = 0.0, 0
    assert sum(1 for _ in kafka_events(kafka_conf, ends, avro_decoder)) > len(avro_side)
    subjects = _subjects(schema_registry, prefix)
    unmatched = [e for e in avro_side if _same_change(e) not in json_side]
    differing = [e for e in avro_side if _same_change(e) in json_side
                 and _content(e) != _content(json_side[_same_change(e)])]
    builder = ReplicaBuilder(spark, pipeline)
    for name in REPLICAS:
        builder.apply(name)
    comparisons = shop.compare(mariadb.connect(), spark, pipeline.lakehouse.database)

    figures = {
        "seed": SEED, "statements": statements,
        "events_compared_with_json": len(avro_side) - len(unmatched),
        "subjects_registered": len(subjects),
        "schema_ids_read": len(set(client.fetched)),
        # Records per second in decode() alone: the Avro side first with its registry
        # fetches (cold), then with every schema cached (warm).
        "avro_decode_per_s_cold": round(cold_rate),
        "avro_decode_per_s_warm": round(avro_decoder.rate()),
        "json_decode_per_s": round(json_decoder.rate()),
        "avro_warm_to_json_decode_rate": round(avro_decoder.rate() / json_decoder.rate(), 2),
        "debezium_events": sum(s.events for s in summaries),
        "per_op": {op: sum(s.per_op().get(op, 0) for s in summaries)
                   for op in ("c", "u", "d", "t", "ddl")},
        "dead_lettered": sum(s.decode_dead_lettered for s in summaries),
        "per_table": {c.replica: [c.source_rows, c.replica_rows, c.mismatched]
                      for c in comparisons},
    }
    drills.record("e2e_avro_converter", figures)
    print(f"\navro converter e2e: {figures}")
    assert [s.committed_offset for s in summaries] == \
        [ends[f"{t}:0"] for t in topics]
    assert figures["dead_lettered"] == 0
    assert all(figures["per_op"].values()), figures["per_op"]
    assert avro_side and not unmatched, unmatched[:3]
    assert not differing, [(e, json_side[_same_change(e)]) for e in differing[:2]]
    # The converter registered each topic's key and value schemas in the registry, and
    # the decoder read them back by id through the Confluent-compatible API.
    assert set(subjects) >= {f"{t}-{side}" for t in topics for side in ("key", "value")}
    assert len(set(client.fetched)) >= len(topics)
    for c in comparisons:
        assert c.source_rows > 0 and c.matches, c
