"""Debezium writes the seeded MariaDB workload in Avro, through a schema registry, and
binlake reads only that: every replica equals its source table, and every row event
equals the one the JSON converter gave for the same binlog position.

A second connector joins the session's Kafka Connect worker with Apicurio's Avro
converter (from Maven Central) for keys and values, in the Confluent wire format
(`as-confluent`, content ids). It registers its schemas in the test's registry
(`avro_wire.SchemaRegistry`: Apicurio's create-artifact and Confluent's by-id lookup
over real HTTP, a fake because no registry server installs here); binlake's
`debezium-avro` source fetches them by id with confluent-kafka's client.
"""

from __future__ import annotations

import uuid

from avro_wire import SchemaRegistry
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
from binlog_assets.dev.connect import DebeziumConnector, KafkaConnect
from binlog_assets.dev.demo import wait_for_debezium
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.formats.debezium_avro import DebeziumAvroDecoder
from binlog_assets.formats.event import OP_DDL, ChangeEvent
from binlog_assets.lakehouse.replica import ReplicaBuilder
from binlog_assets.orchestration.consume_runs import ChangelogRunConfig, consume_partition
from binlog_assets.orchestration.partitions import partition_key

SEED = 20261124
STATEMENTS = 300


def _same_change(event: ChangeEvent) -> tuple:
    return (event.table, event.op, event.position, event.key, event.ddl)


def _content(event: ChangeEvent) -> tuple:
    return (event.key_columns, event.before, event.after, event.column_types,
            event.source_ts)


def test_debezium_s_avro_converter_through_a_registry(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, pipeline_config: PipelineConfig,
    spark,
) -> None:
    """Debezium itself writes Avro: a second connector in the session's worker, with
    Apicurio's converter (the Confluent wire format, keys and values) registering its
    schemas in the test registry; binlake reads only its topics."""
    kafka_conf = dict(pipeline_config.kafka)
    prefix = f"avro{uuid.uuid4().hex[:4]}"
    with SchemaRegistry() as registry:
        converter = {
            f"{side}.converter": "io.apicurio.registry.utils.converter.AvroConverter"
            for side in ("key", "value")}
        for side in ("key", "value"):
            converter |= {
                f"{side}.converter.apicurio.registry.url": f"{registry.url}/apis/registry/v2",
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
            ends = wait_for_debezium(kafka_conf, topics, settle=2.0)
        finally:
            debezium_connect.remove_connector(connector.name)
        data = pipeline_config.model_dump(mode="json", exclude_none=True)
        data["kafka"]["group.id"] = f"e2e-avroconv-{uuid.uuid4().hex[:6]}"
        data["lakehouse"] = {**data["lakehouse"], "database": "e2e_avro_converter"}
        data["schema_registry"] = {"url": registry.url}
        data["sources"] = [{"name": "shop_avro", "topics": topics, "format": "debezium-avro",
                            "tables": TABLES}]
        cfg = parse_config(data)
        summaries = [consume_partition(cfg, dict(cfg.kafka), partition_key(t, 0),
                                       ChangelogRunConfig(), HandlerRegistry(),
                                       group=cfg.kafka["group.id"])[0] for t in topics]
        # The session's JSON connector read the same binlog: each Avro row event must
        # equal the JSON event at its position, values and types alike. (Schema-change
        # events are each connector's own: it lists the tables its history holds, and
        # this connector's history began at its start.)
        json_side = {_same_change(e): e for e in kafka_events(kafka_conf,
                                                              wait_published(kafka_conf))}
        avro_side = [e for e in kafka_events(kafka_conf, ends, DebeziumAvroDecoder(
            schema_registry={"url": registry.url})) if e.op != OP_DDL]
    unmatched = [e for e in avro_side if _same_change(e) not in json_side]
    differing = [e for e in avro_side if _same_change(e) in json_side
                 and _content(e) != _content(json_side[_same_change(e)])]
    builder = ReplicaBuilder(spark, cfg)
    for name in REPLICAS:
        builder.apply(name)
    comparisons = shop.compare(mariadb.connect(), spark, cfg.lakehouse.database)

    figures = {
        "seed": SEED, "statements": statements,
        "events_compared_with_json": len(avro_side) - len(unmatched),
        "schemas_registered": len(registry.schemas),
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
    # Keys and values were read through the registry's own wire format.
    assert any(r.startswith("POST /apis/registry/v2/groups/") for r in registry.requests)
    assert sum(r.startswith("GET /schemas/ids/") for r in registry.requests) >= len(topics)
    for c in comparisons:
        assert c.source_rows > 0 and c.matches, c
