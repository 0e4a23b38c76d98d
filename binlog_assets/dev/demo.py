"""The README's main job on the embedded local stack: `python -m binlog_assets.dev.demo`.

Starts the broker (unless the config names a cluster), publishes a few Debezium change
events for the configured source, runs the main job through the Dagster instance under
`DAGSTER_HOME` (so the run shows in `dagster dev`), and prints where the output is.
"""

from __future__ import annotations

import sys
import time

import dagster as dg
import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from binlog_assets.config import PipelineConfig, load_config
from binlog_assets.dev import stack


def debezium_products_events(start_ts_ms: int) -> list[tuple[bytes, bytes]]:
    """A tiny products history: three inserts, an update, a delete (key, value) pairs."""
    rows = [
        ("c", None, {"id": 1, "name": "scooter", "weight": 3.14}),
        ("c", None, {"id": 2, "name": "car battery", "weight": 8.1}),
        ("c", None, {"id": 3, "name": "drill bits", "weight": 0.8}),
        ("u", {"id": 2, "name": "car battery", "weight": 8.1},
         {"id": 2, "name": "car battery", "weight": 8.4}),
        ("d", {"id": 3, "name": "drill bits", "weight": 0.8}, None),
    ]
    out = []
    for i, (op, before, after) in enumerate(rows):
        key = (after or before)["id"]
        value = {
            "before": before, "after": after, "op": op, "ts_ms": start_ts_ms + i,
            "source": {"version": "3.3.0.Final", "connector": "mysql", "name": "shop",
                       "ts_ms": start_ts_ms + i, "snapshot": "false", "db": "inventory",
                       "table": "products", "server_id": 1, "file": "mysql-bin.000003",
                       "pos": 1000 + 100 * i, "row": 0},
        }
        out.append((orjson.dumps({"id": key}), orjson.dumps(value)))
    return out


def publish_demo_events(config: PipelineConfig, kafka_conf: dict) -> int:
    topic = config.sources[0].topics[0]
    admin = AdminClient({"bootstrap.servers": kafka_conf["bootstrap.servers"]})
    if topic not in admin.list_topics(timeout=10).topics:
        for f in admin.create_topics([NewTopic(topic, num_partitions=2)]).values():
            f.result()
    producer = Producer({"bootstrap.servers": kafka_conf["bootstrap.servers"],
                         "enable.idempotence": True})
    events = debezium_products_events(int(time.time() * 1000))
    for key, value in events:
        producer.produce(topic, key=key, value=value)
    producer.flush(30)
    return len(events)


def main() -> int:
    config = load_config()
    print(stack.up(config))
    kafka_conf = stack.kafka_client_config(config)
    print(f"published {publish_demo_events(config, kafka_conf)} change events")
    from binlog_assets.definitions import defs

    with dg.DagsterInstance.get() as instance:
        result = defs.get_job_def("smoke_job").execute_in_process(instance=instance)
    if not result.success:
        print("main job failed", file=sys.stderr)
        return 1
    mat = result.asset_materializations_for_node("smoke_changelog")[0]
    md = {k: v.value for k, v in mat.metadata.items()}
    print(f"run {result.run_id}: {md['events']} change events in table {md['table']}")
    print(f"output table location: {md['location']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
