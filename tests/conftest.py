"""Session-wide fixtures: the real Kafka broker and the real Spark + Delta session.

Both start once per test session on loopback (a free port, a temporary directory) and
are shared by every integration test; unit tests never touch them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.dev.kafka import KafkaBroker


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    seconds = broker.start()
    print(f"\nkafka broker {broker.bootstrap_servers} ready in {seconds:.1f}s")
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def lakehouse_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lakehouse")


@pytest.fixture(scope="session")
def pipeline_config(kafka_broker: KafkaBroker, lakehouse_dir: Path) -> PipelineConfig:
    return parse_config(
        {
            "kafka": {
                "bootstrap.servers": kafka_broker.bootstrap_servers,
                "group.id": "binlake-test",
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
            },
            "lakehouse": {"path": str(lakehouse_dir), "database": "binlake_test"},
            "spark": {"master": "local[2]", "conf": {"spark.driver.memory": "2g"}},
            "sources": [
                {"name": "shop", "topics": ["test.inventory.products"], "format": "debezium",
                 "tables": [{"source": "inventory.products", "replica": "products"}]}
            ],
        }
    )


@pytest.fixture(scope="session")
def spark(pipeline_config: PipelineConfig):
    from binlog_assets.lakehouse.spark import get_spark

    session = get_spark(pipeline_config)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def config_file(pipeline_config: PipelineConfig, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's pipeline config written as YAML, for code that loads by path."""
    import yaml

    path = tmp_path_factory.mktemp("config") / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline_config.model_dump(mode="json", exclude_none=True)))
    return path


@pytest.fixture
def binlake_env(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BINLAKE_CONFIG", str(config_file))
    return config_file


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Anything that asks for the real stack is an integration test, marked as such.
    real = {"kafka_broker", "spark", "pipeline_config", "config_file", "binlake_env"}
    for item in items:
        if real & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


os.environ.setdefault("DAGSTER_TELEMETRY_DISABLED", "1")
