"""The changelog's asset checks on a real broker: the lag check against its limit, and
the checkpoint agreement check finding a partition whose Kafka commit is ahead of the
changelog and the metadata (a run that died between its Kafka commit and the rest)."""

from __future__ import annotations

import uuid
from pathlib import Path

import dagster as dg
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

from binlog_assets.config import PipelineConfig
from binlog_assets.dev.kafka import create_topic
from binlog_assets.orchestration.checks import changelog_lag_check, checkpoint_agreement_check
from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME, partition_key
from binlog_assets.orchestration.resources import BinlakeResource


def _setup(pipeline_config: PipelineConfig, tmp_path: Path, limit: int):
    bootstrap = pipeline_config.bootstrap_servers
    topic = create_topic(bootstrap, "checks", partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, n in ((0, 5), (1, 2)):
        for i in range(n):
            producer.produce(topic, partition=partition, value=b"{}", key=str(i).encode())
    assert producer.flush(10) == 0
    data = pipeline_config.model_dump(mode="json", exclude_none=True)
    data["kafka"]["group.id"] = f"g-{uuid.uuid4().hex[:6]}"
    data["lakehouse"]["database"] = f"checks_{uuid.uuid4().hex[:6]}"
    data["sources"] = [{"name": "s", "topics": [topic], "format": "debezium"}]
    data["dagster"] = {"max_lag_records": limit}
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(data))
    return topic, BinlakeResource(config_path=str(path)), data["kafka"]


def _check(check, instance: dg.DagsterInstance, binlake: BinlakeResource) -> dg.AssetCheckResult:
    return check(dg.build_asset_check_context(instance=instance,
                                              resources={"binlake": binlake}))


def test_lag_check_fails_above_the_limit_and_names_the_partitions(
        pipeline_config: PipelineConfig, tmp_path: Path) -> None:
    topic, binlake, _ = _setup(pipeline_config, tmp_path, limit=3)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME,
                                        [partition_key(topic, 0), partition_key(topic, 1)])
        result = _check(changelog_lag_check, instance, binlake)
    assert not result.passed
    md = {k: v.value for k, v in result.metadata.items()}
    assert [r.data for r in md["partitions_over_limit"].records] == [
        {"partition": partition_key(topic, 0), "lag_records": 5}]
    assert (md["max_lag_records"], md["total_lag_records"]) == (5, 7)
    assert md["limit"] == "3 records (dagster.max_lag_records)"


def test_agreement_check_reports_a_kafka_commit_the_changelog_does_not_have(
        pipeline_config: PipelineConfig, tmp_path: Path) -> None:
    topic, binlake, kafka = _setup(pipeline_config, tmp_path, limit=100)
    consumer = Consumer({**kafka, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    finally:
        consumer.close()
    key0, key1 = partition_key(topic, 0), partition_key(topic, 1)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, [key0, key1])
        passed = _check(changelog_lag_check, instance, binlake)
        result = _check(checkpoint_agreement_check, instance, binlake)
    assert passed.passed
    assert not result.passed and result.severity == dg.AssetCheckSeverity.WARN
    assert result.metadata["partitions_disagreeing"].value == 1
    rows = {r.data["partition"]: r.data for r in result.metadata["checkpoints"].records}
    assert rows[key0] == {"partition": key0, "changelog": None, "metadata": None,
                          "kafka": 4, "agree": False}
    # The partition nothing committed for agrees (nothing anywhere).
    assert rows[key1] == {"partition": key1, "changelog": None, "metadata": None,
                          "kafka": None, "agree": True}
