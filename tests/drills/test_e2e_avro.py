"""The seeded MariaDB workload in Avro: every replica equals its source table, and every
real Debezium record decodes to the same events in Avro as in JSON.

Debezium publishes the workload with its JSON converter (schemas on). Each record, the
schema-change topic's included, is rewritten as its Avro converter would have written it
(`avro_wire.transcode`: AvroData's schema, registered; the registry's wire format) into
`avro.<topic>`, keys too. binlake then reads only the Avro topics (`format:
debezium-avro`), writes the changelog and builds the replicas, which must equal MariaDB.
The registry is the test's (`avro_wire.SchemaRegistry`): no registry server installs on
this machine, so this is the Avro converter's output by its rules, not by its code.
"""

from __future__ import annotations

import uuid

from avro_wire import SchemaRegistry, transcode
from confluent_kafka import Consumer, Producer, TopicPartition
from drill_lib import REPLICAS, TABLES, TOPICS, wait_published, workload

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.dev import drills, shop
from binlog_assets.dev.connect import KafkaConnect
from binlog_assets.dev.kafka import create_topics
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.formats.debezium import DebeziumDecoder
from binlog_assets.formats.debezium_avro import DebeziumAvroDecoder
from binlog_assets.lakehouse.replica import ReplicaBuilder
from binlog_assets.orchestration.consume_runs import ChangelogRunConfig, consume_partition
from binlog_assets.orchestration.partitions import partition_key

SEED = 20261124
STATEMENTS = 300


def _records(kafka_conf: dict, topic: str, end: int) -> list:
    consumer = Consumer({"bootstrap.servers": kafka_conf["bootstrap.servers"],
                         "group.id": f"avro-read-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list = []
    try:
        while len(out) < end:
            out += [m for m in consumer.consume(1000, 5) if m.error() is None]
    finally:
        consumer.close()
    return out[:end]


def test_seeded_workload_in_avro_replicas_equal_source(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, pipeline_config: PipelineConfig,
    spark,
) -> None:
    kafka_conf = dict(pipeline_config.kafka)
    conn = mariadb.connect()
    statements = workload(conn, SEED, STATEMENTS)
    ends = wait_published(kafka_conf)

    with SchemaRegistry() as registry:
        avro_topics = [f"avro.{uuid.uuid4().hex[:4]}.{t}" for t in TOPICS]
        create_topics(kafka_conf["bootstrap.servers"], avro_topics)
        producer = Producer({"bootstrap.servers": kafka_conf["bootstrap.servers"]})
        json_decoder = DebeziumDecoder()
        avro_decoder = DebeziumAvroDecoder(schema_registry={"url": registry.url})
        compared = 0
        for topic, avro_topic in zip(TOPICS, avro_topics, strict=True):
            for msg in _records(kafka_conf, topic, ends[partition_key(topic, 0)]):
                key, value = transcode(registry, msg.key()), transcode(registry, msg.value())
                producer.produce(avro_topic, key=key, value=value, partition=0)
                # The same record, both ways: equal events (on the Avro topic's name).
                coordinates = {"topic": avro_topic, "partition": 0, "offset": msg.offset()}
                assert avro_decoder.decode(value, key=key, **coordinates) == \
                    json_decoder.decode(msg.value(), key=msg.key(), **coordinates), msg.offset()
                compared += 1
        assert producer.flush(60) == 0

        data = pipeline_config.model_dump(mode="json", exclude_none=True)
        data["kafka"]["group.id"] = f"e2e-avro-{uuid.uuid4().hex[:6]}"
        data["lakehouse"] = {**data["lakehouse"], "database": "e2e_avro"}
        data["schema_registry"] = {"url": registry.url}
        data["sources"] = [{"name": "shop_avro", "topics": avro_topics,
                            "format": "debezium-avro", "tables": TABLES}]
        cfg = parse_config(data)
        summaries = [consume_partition(cfg, dict(cfg.kafka), partition_key(t, 0),
                                       ChangelogRunConfig(), HandlerRegistry(),
                                       group=cfg.kafka["group.id"])[0] for t in avro_topics]
    builder = ReplicaBuilder(spark, cfg)
    for name in REPLICAS:
        builder.apply(name)
    comparisons = shop.compare(conn, spark, cfg.lakehouse.database)

    figures = {
        "seed": SEED, "statements": statements, "records_compared_json_vs_avro": compared,
        "schemas_registered": len(registry.schemas),
        "debezium_events": sum(s.events for s in summaries),
        "dead_lettered": sum(s.decode_dead_lettered for s in summaries),
        "per_table": {c.replica: [c.source_rows, c.replica_rows, c.mismatched]
                      for c in comparisons},
    }
    drills.record("e2e_avro", figures)
    print(f"\navro e2e: {figures}")
    assert [s.committed_offset for s in summaries] == \
        [ends[partition_key(t, 0)] for t in TOPICS]
    assert figures["dead_lettered"] == 0
    # The workload's ALTER TABLE gave customers a second value schema mid-stream.
    assert len(registry.schemas) > len(TOPICS) + 2
    for c in comparisons:
        assert c.source_rows > 0 and c.matches, c
