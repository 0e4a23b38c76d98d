"""The source's life on the real stack: a shop pipeline whose MariaDB primary fails over,
fails back, has its binlog reset or its connector's offsets lost, and a check after each
step that every replica equals the primary of the moment.

`ShopLife` runs one Debezium connector (in the session's Connect worker) under its own
topic prefix, consumes every partition of its topics with bounded runs as the changelog
asset does, and builds the replicas on the session's Spark.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka.admin import AdminClient

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.dev import shop
from binlog_assets.dev.connect import DebeziumConnector, DebeziumFence, KafkaConnect
from binlog_assets.dev.mariadb import FENCE_DATABASE, HEARTBEAT_DATABASE, MariaDBServer
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.orchestration.partitions import partition_key
from binlog_assets.rounds.round import consume_partition

# A read-only account for the parity check, made on a primary before its replicas copy it.
PARITY_USER, PARITY_PASSWORD = "binlake_parity", "parity-pw"
TABLES = [
    {"source": "shop.customers", "replica": "customers"},
    {"source": "shop.products", "replica": "products"},
    {"source": r"shop_\d+\.orders", "replica": "orders"},
]


@dataclass
class ShopLife:
    """One connector's shop pipeline, from its MariaDB of the moment to the replicas."""

    base: PipelineConfig
    connect: KafkaConnect
    primary: MariaDBServer
    spark: Any
    name: str = field(default_factory=lambda: f"life{uuid.uuid4().hex[:6]}")
    snapshot_mode: str = "initial"
    extra: dict[str, str] = field(default_factory=dict)
    connector_server_id: int = 184100
    heartbeat_seconds: float = 5.0
    parity_wait_seconds: float = 60.0

    def __post_init__(self) -> None:
        self.pipeline = self._pipeline(self.primary)
        self.kafka_conf = dict(self.pipeline.kafka)
        self.connector = self._connector(self.primary)

    def _pipeline(self, server: MariaDBServer) -> PipelineConfig:
        """The shop pipeline, its parity checks reading `server` (the runbook points
        `sources[].connection` at the primary of the moment)."""
        data = self.base.model_dump(mode="json", exclude_none=True)
        data["kafka"]["group.id"] = self.name
        data["lakehouse"] = {**data["lakehouse"], "database": self.name}
        data["parity"] = {"chunk_rows": 40, "wait_seconds": self.parity_wait_seconds}
        data["sources"] = [{"name": "shop", "topics": [f"^{self.name}(\\..*)?$"],
                            "format": "debezium", "tables": TABLES,
                            "connection": {"host": "127.0.0.1", "port": server.port,
                                           "user": PARITY_USER, "password": PARITY_PASSWORD}}]
        return parse_config(data)

    def _connector(self, server: MariaDBServer) -> DebeziumConnector:
        return DebeziumConnector.for_server(
            server, name=self.name, topic_prefix=self.name,
            server_id=self.connector_server_id,
            database_include_list=("shop", "shop_1", "shop_2", FENCE_DATABASE,
                                   HEARTBEAT_DATABASE),
            snapshot_mode=self.snapshot_mode, heartbeat_seconds=self.heartbeat_seconds,
            extra=self.extra)

    def start(self) -> float:
        return self.connect.add_connector(self.connector)

    def point_at(self, server: MariaDBServer, **settings: Any) -> float:
        """What a failover runbook does: the connector's config names the new primary."""
        self.primary = server
        for key, value in settings.items():
            setattr(self, key, value)
        self.pipeline = self._pipeline(server)
        self.connector = self._connector(server)
        return self.connect.reconfigure(self.connector)

    def stop(self) -> None:
        self.connect.remove_connector(self.name)

    def topics(self) -> list[str]:
        admin = AdminClient({"bootstrap.servers": self.kafka_conf["bootstrap.servers"]})
        names = admin.list_topics(timeout=10).topics
        return sorted(t for t in names if t == self.name or t.startswith(self.name + "."))

    def keys(self) -> list[str]:
        return [partition_key(t, 0) for t in self.topics()]

    def sync(self) -> list[shop.TableComparison]:
        """Everything the primary committed into the changelog and every replica; how
        each replica compares with the primary."""
        DebeziumFence(self.connect, self.primary, self.name).wait()
        time.sleep(0.5)  # the fence row's record reaches its topic with the offset commit
        self.consume()
        self.build()
        return self.compare()

    def consume(self) -> list:
        group = self.pipeline.kafka["group.id"]
        return [consume_partition(self.pipeline, self.kafka_conf, key, ChangelogRunConfig(),
                                  HandlerRegistry(), group=group)[0] for key in self.keys()]

    def build(self) -> list:
        builder = ReplicaBuilder(self.spark, self.pipeline)
        return [builder.apply(name) for name in sorted(shop.REPLICAS)]

    def lineages(self) -> list:
        from binlog_assets.lakehouse.changelog import ChangelogWriter

        return ChangelogWriter(self.pipeline).lineages("shop")

    def compare(self) -> list[shop.TableComparison]:
        return shop.compare(self.primary.connect(), self.spark, self.pipeline.lakehouse.database)


def grant_parity(server: MariaDBServer) -> None:
    """The parity check's account on `server`: reads the shop, and the binlog status."""
    server.execute(f"CREATE USER IF NOT EXISTS '{PARITY_USER}'@'%' IDENTIFIED BY "
                   f"'{PARITY_PASSWORD}'",
                   *(f"GRANT SELECT ON {db}.* TO '{PARITY_USER}'@'%'"
                     for db in ("shop", "shop_1", "shop_2")),
                   f"GRANT BINLOG MONITOR ON *.* TO '{PARITY_USER}'@'%'")


def assert_equal(comparisons: list[shop.TableComparison], when: str) -> None:
    for c in comparisons:
        assert c.matches, f"{when}: {c}"


def purge_to(server: MariaDBServer, current: str, *, end_dumps: bool = False) -> None:
    """PURGE BINARY LOGS up to `current`, until done: MariaDB keeps a file a binlog dump
    thread still reads (a connector moving on to the next file; with `end_dumps`, a
    stopped connector's thread that lingers, which is ended)."""
    deadline = time.monotonic() + 30
    while True:
        if end_dumps:
            for row in server.execute("SHOW PROCESSLIST"):
                if str(row[4]).startswith("Binlog Dump"):
                    server.execute(f"KILL {int(row[0])}")
        server.execute(f"PURGE BINARY LOGS TO '{current}'")
        left = [r[0] for r in server.execute("SHOW BINARY LOGS")]
        if left == [current]:
            return
        assert time.monotonic() < deadline, (left, server.execute("SHOW PROCESSLIST"))
        time.sleep(0.5)
