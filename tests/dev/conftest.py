"""Session fixtures for the binlog source: a real MariaDB and Debezium in Kafka Connect.

`mariadb` is a `mariadbd` with a ROW binlog on a free loopback port; `debezium_connect`
is a Connect standalone worker running Debezium's MariaDB connector (topic prefix
`shop`, every non-system database) into the session's `kafka_broker`. Both start once
and serve any test that asks, so an end-to-end test can reuse them as they are.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from binlog_assets.config import CONFIG_ENV, DEFAULT_CONFIG_PATH, load_config
from binlog_assets.dev.connect import DebeziumConnector, KafkaConnect
from binlog_assets.dev.kafka import KafkaBroker
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.dev.stack import source_skip_reason

# Read at import, before any test's monkeypatch points BINLAKE_CONFIG at the session's
# own config (whose bootstrap.servers is the embedded broker, not the user's cluster).
_USER_CONFIG = Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH)


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    server = MariaDBServer(tmp_path_factory.mktemp("mariadb"))
    seconds = server.start()
    print(f"\nmariadb 127.0.0.1:{server.port} ready in {seconds:.1f}s")
    try:
        yield server
    finally:
        server.stop()


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
