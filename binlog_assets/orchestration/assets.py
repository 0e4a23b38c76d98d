"""Assets a user materializes from the Dagster UI, sensors and backfills.

For now one smoke asset proves the local stack end to end: it reads every partition of
the configured source topics from the beginning up to the end offsets seen at its start,
decodes the change events, and writes them to a Delta table with Spark.
"""


import dagster as dg
from confluent_kafka import Consumer, TopicPartition
from dagster_pyspark import LazyPySparkResource

from binlog_assets.formats import make_decoder
from binlog_assets.orchestration.resources import BinlakeResource

SMOKE_TABLE = "smoke_changelog"


def _read_to_end(conf: dict, topics: tuple[str, ...]) -> list[tuple[str, int, int, bytes | None]]:
    """Every record of `topics` from offset 0 up to the end offsets seen at the start."""
    consumer = Consumer({**conf, "group.id": "binlake-smoke", "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(timeout=10)
        assignments, ends = [], {}
        for topic in topics:
            if topic not in meta.topics:
                raise dg.Failure(f"topic {topic!r} does not exist on the broker")
            for p in meta.topics[topic].partitions:
                lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=False)
                if hi > lo:
                    assignments.append(TopicPartition(topic, p, lo))
                    ends[(topic, p)] = hi
        consumer.assign(assignments)
        out, pending = [], dict(ends)
        while pending:
            for msg in consumer.consume(num_messages=500, timeout=5):
                if msg.error():
                    raise dg.Failure(f"kafka error: {msg.error()}")
                tp = (msg.topic(), msg.partition())
                if tp in pending and msg.offset() < pending[tp]:
                    out.append((msg.topic(), msg.partition(), msg.offset(), msg.value()))
                    if msg.offset() + 1 >= pending[tp]:
                        del pending[tp]
        return out
    finally:
        consumer.close()


@dg.asset(group_name="smoke", kinds={"kafka", "spark", "delta"})
def smoke_changelog(
    context: dg.AssetExecutionContext, binlake: BinlakeResource, pyspark: LazyPySparkResource
) -> dg.MaterializeResult:
    """Smoke run of the local stack: every change event on the source topics, decoded and
    written to the `smoke_changelog` Delta table (overwritten each run)."""
    cfg = binlake.pipeline
    source = cfg.sources[0]
    records = _read_to_end(binlake.kafka_conf(), source.topics)
    decoder = make_decoder(source.format)
    rows = [
        (e.topic, e.partition, e.offset, e.table, e.op, repr(e.key), e.position.file,
         e.position.pos, e.source_ts)
        for topic, partition, offset, value in records
        for e in decoder.decode(value, topic=topic, partition=partition, offset=offset)
    ]
    spark = pyspark.spark_session
    spark.sql(f"CREATE DATABASE IF NOT EXISTS `{cfg.lakehouse.database}`")
    schema = ("topic string, partition int, offset long, table string, op string, "
              "key string, binlog_file long, binlog_pos long, source_ts long")
    name = f"`{cfg.lakehouse.database}`.`{SMOKE_TABLE}`"
    spark.createDataFrame(rows, schema).write.format("delta").mode("overwrite").saveAsTable(name)
    location = spark.sql(f"DESCRIBE DETAIL {name}").first()["location"]
    written = spark.table(name).count()
    context.log.info(f"wrote {written} change events to {name} at {location}")
    return dg.MaterializeResult(
        metadata={
            "records": dg.MetadataValue.int(len(records)),
            "events": dg.MetadataValue.int(written),
            "table": dg.MetadataValue.text(name),
            "location": dg.MetadataValue.path(location),
        }
    )
