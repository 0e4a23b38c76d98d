"""The main job's smoke asset, materialized through Dagster on the real broker and Spark."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from binlog_assets.config import PipelineConfig
from binlog_assets.dev.demo import debezium_products_events
from binlog_assets.orchestration.assets import smoke_changelog
from binlog_assets.orchestration.resources import BinlakeResource, spark_resource


def test_smoke_changelog_materializes_events_into_delta(
    pipeline_config: PipelineConfig, config_file: Path, spark
) -> None:
    topic = pipeline_config.sources[0].topics[0]
    bootstrap = pipeline_config.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic not in admin.list_topics(timeout=10).topics:
        for f in admin.create_topics([NewTopic(topic, num_partitions=2)]).values():
            f.result()
    p = Producer({"bootstrap.servers": bootstrap})
    events = debezium_products_events(1_700_000_000_000)
    for key, value in events:
        p.produce(topic, key=key, value=value)
    assert p.flush(10) == 0

    result = dg.materialize(
        [smoke_changelog],
        resources={"binlake": BinlakeResource(config_path=str(config_file)),
                   "pyspark": spark_resource(pipeline_config)},
    )
    assert result.success
    md = result.asset_materializations_for_node("smoke_changelog")[0].metadata
    assert md["records"].value >= len(events)
    table = md["table"].value
    rows = spark.table(table).collect()
    ops = sorted(r.op for r in rows if r.source_ts is not None and r.source_ts < 1_800_000_000_000)
    assert ops.count("c") >= 3 and "u" in ops and "d" in ops
    assert {r.table for r in rows} == {"inventory.products"}
    assert str(pipeline_config.lakehouse.path) in md["location"].value
