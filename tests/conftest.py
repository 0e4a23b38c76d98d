"""Session-wide fixtures: the real Kafka broker, the real Spark + Delta session, and the
binlog source (MariaDB with a ROW binlog, Debezium in Kafka Connect).

Each starts once per test session on loopback (a free port, a temporary directory) and
is shared by every integration test that asks for it; unit tests never touch them.
`mariadb` is a `mariadbd` with a ROW binlog on a free loopback port; `debezium_connect`
is a Connect standalone worker running Debezium's MariaDB connector (topic prefix
`shop`, every non-system database) into the session's `kafka_broker`, so the source
tests, the end-to-end test and the drills share one of each. `schema_registry` is
Apicurio Registry (built by `make registry`), for the Avro tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from binlog_assets.config import (
    CONFIG_ENV,
    DEFAULT_CONFIG_PATH,
    PipelineConfig,
    load_config,
    parse_config,
)
from binlog_assets.dev.connect import DebeziumConnector, DebeziumFence, KafkaConnect
from binlog_assets.dev.kafka import KafkaBroker
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.dev.redis import REDIS_URL_ENV, RedisServer
from binlog_assets.dev.registry import SchemaRegistryServer
from binlog_assets.dev.stack import source_skip_reason
from binlog_assets.lakehouse.spark import INTERPRETED


def _serve(service, label: Callable[[], str]) -> Iterator:
    """Start a local service for the session, say how long it took, stop it at the end."""
    seconds = service.start()
    print(f"\n{label()} ready in {seconds:.1f}s")
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"), c1=True)
    yield from _serve(broker, lambda: f"kafka broker {broker.bootstrap_servers}")


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
            # Interpreted, as a builder runs a small batch (`lakehouse/spark.py`): the
            # tests' own queries are small too, and generating their code was a fifth
            # of the session driver's CPU. `test_spark.py` applies a batch compiled.
            "spark": {"master": "local[2]",
                      "conf": {"spark.driver.memory": "2g", **dict(INTERPRETED)}},
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



# Read at import, before any test's monkeypatch points BINLAKE_CONFIG at the session's
# own config (whose bootstrap.servers is the embedded broker, not the user's cluster).
_USER_CONFIG = Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH)


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    server = MariaDBServer(tmp_path_factory.mktemp("mariadb"))
    yield from _serve(server, lambda: f"mariadb 127.0.0.1:{server.port}")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield from _serve(server, lambda: f"redis 127.0.0.1:{server.port}")


@pytest.fixture(scope="session")
def schema_registry(
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchemaRegistryServer]:
    """The session's Apicurio Registry; tests keep apart by subject and artifact names."""
    server = SchemaRegistryServer(tmp_path_factory.mktemp("schema-registry"))
    yield from _serve(server, lambda: f"schema registry {server.ccompat_url}")


@pytest.fixture
def redis_url(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The session's Redis, empty, named by `REDIS_URL` as handlers read it."""
    redis_server.client().flushall()
    monkeypatch.setenv(REDIS_URL_ENV, redis_server.url)
    return redis_server.url


@pytest.fixture(scope="session")
def debezium_connect(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaConnect]:
    # Checked before the broker and database fixtures run, so a skip starts nothing.
    if _USER_CONFIG.exists() and (reason := source_skip_reason(load_config(_USER_CONFIG))):
        pytest.skip(reason)
    broker: KafkaBroker = request.getfixturevalue("kafka_broker")
    server: MariaDBServer = request.getfixturevalue("mariadb")
    connect = KafkaConnect(
        tmp_path_factory.mktemp("connect"), broker.bootstrap_servers,
        DebeziumConnector.for_server(server, topic_prefix="shop"),
    )
    seconds = connect.start()
    print(f"\nkafka connect {connect.rest_url} + debezium ready in {seconds:.1f}s")
    try:
        yield connect
    finally:
        connect.stop()


@pytest.fixture(scope="session")
def debezium_fence(debezium_connect: KafkaConnect, mariadb: MariaDBServer) -> DebeziumFence:
    """Waits until the session's connector published what MariaDB committed before."""
    return DebeziumFence(debezium_connect, mariadb)


# The folders in the order the tests are collected: the soak's brief variant (its own
# stack, minutes), the long drills and the Spark applies first, the folders of many
# short tests last. `--dist loadfile` hands out the files with the most tests first (xdist
# reorders by count; this order breaks ties); kept in this order instead
# (`--no-loadscope-reorder`), the suite took as long (docs/testing.md).
FOLDER_ORDER = ("soak", "drills", "parity", "load", "lakehouse", "orchestration", "dev",
                "consume")


def _folder_rank(item: pytest.Item) -> int:
    parts = item.path.relative_to(Path(__file__).parent).parts
    return FOLDER_ORDER.index(parts[0]) if parts[0] in FOLDER_ORDER else len(FOLDER_ORDER)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Anything that asks for the real stack is an integration test, marked as such.
    real = {"kafka_broker", "spark", "pipeline_config", "config_file", "binlake_env",
            "mariadb", "debezium_connect", "debezium_fence", "redis_server", "redis_url",
            "schema_registry"}
    for item in items:
        if real & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    items.sort(key=_folder_rank)  # stable: each file's tests stay together, in order


os.environ.setdefault("DAGSTER_TELEMETRY_DISABLED", "1")
