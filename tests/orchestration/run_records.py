"""What a run left behind, for tests: its Dagster records as text (to grep for a
secret) and the dead letters it published."""

from __future__ import annotations

import uuid

import dagster as dg
from confluent_kafka import Consumer, Message, TopicPartition
from dagster._serdes import serialize_value


def recorded_texts(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """The run's events (metadata and logs included), tags and run config, serialized."""
    run = instance.get_run_by_id(run_id)
    texts = [serialize_value(r) for r in instance.all_logs(run_id)]
    return texts + [serialize_value(run.tags), serialize_value(run.run_config)]


def dead_letters(bootstrap: str, topic: str, most: int = 10) -> list[Message]:
    """Up to `most` records of dead-letter topic `topic` (partition 0), from its start."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:6]}"})
    reader.assign([TopicPartition(topic, 0, 0)])
    try:
        return [m for m in reader.consume(most, 10) if m.error() is None]
    finally:
        reader.close()
