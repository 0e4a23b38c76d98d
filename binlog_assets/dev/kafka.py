"""The embedded Apache Kafka broker: one real node in KRaft mode on loopback.

The dev tooling (`python -m binlog_assets.dev.stack`) and the test fixtures start the
same broker: the Kafka jars Maven resolved into `.cache/jars/kafka`, a data directory
formatted with `kafka.tools.StorageTool`, and `kafka.Kafka` as a child JVM. Nothing
here runs when the user's config names `bootstrap.servers`.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from binlog_assets.dev.process import LocalDaemon, free_port, port_open
from binlog_assets.environment import EMBEDDED_BROKER_STEM, jars_dir

if TYPE_CHECKING:
    from confluent_kafka import Producer

_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
"""


@dataclass
class KafkaBroker(LocalDaemon):
    """A single-node KRaft broker whose state lives under `data_dir`.

    `start()` is idempotent: a broker already running from the same directory (its pid
    file names a live process) is reused, so `make demo` twice does not start two.
    """

    stem: ClassVar[str] = EMBEDDED_BROKER_STEM

    data_dir: Path
    port: int | None = None
    controller_port: int | None = None
    heap: str = "768m"
    # SCRAM-SHA-512 users (name -> password): with any, a SASL_PLAINTEXT listener on
    # `sasl_port` beside the plaintext one (which the broker and the stack's tools use).
    scram_users: dict[str, str] = field(default_factory=dict)
    sasl_port: int | None = None
    # C1 only (-XX:TieredStopAtLevel=1): a broker serving a trickle, as the tests' do, spends
    # a third less CPU starting and idling; the benches' keep the tiered JIT for throughput.
    c1: bool = False

    @property
    def bootstrap_servers(self) -> str:
        if self.port is None:
            raise RuntimeError("broker not started")
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap_servers(self) -> str:
        if self.sasl_port is None:
            raise RuntimeError("broker not started with scram_users")
        return f"127.0.0.1:{self.sasl_port}"

    def _marker(self) -> Path:
        return self.data_dir

    def start(self, timeout: float = 60.0) -> float:
        """Start (or reuse) the broker; returns the seconds it took to accept clients."""
        began = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._reuse_port():
            self._wait_ready(began, timeout)
            return time.monotonic() - began
        self.port = self.port or free_port()
        self.controller_port = self.controller_port or free_port()
        if self.scram_users:
            self.sasl_port = self.sasl_port or free_port()
        props = self._write_config()
        logs = self.data_dir / "logs"
        if not (logs / "meta.properties").exists():
            # SCRAM credentials live in the cluster's metadata, written when it is formatted.
            scram = [f"--add-scram=SCRAM-SHA-512=[name={name},password={password}]"
                     for name, password in self.scram_users.items()]
            self._java(
                "kafka.tools.StorageTool", "format", "--config", str(props),
                # One form: a random id starting with "-" would read as an option.
                f"--cluster-id={_cluster_id()}", "--ignore-formatted", *scram,
            ).check_returncode()
        cmd = self._java_cmd("kafka.Kafka", str(props))
        self._launch(cmd, "broker.stdout", lambda proc: self._wait_ready(began, timeout, proc))
        return time.monotonic() - began

    def status(self) -> str:
        pid = self.running_pid()
        if pid is None:
            return f"kafka: stopped (data in {self.data_dir})"
        port = self.port_file.read_text() if self.port_file.exists() else "?"
        return f"kafka: running pid={pid} bootstrap.servers=127.0.0.1:{port} data={self.data_dir}"

    def _write_config(self) -> Path:
        log4j = self.data_dir / "log4j2.properties"
        log4j.write_text(_LOG4J2.format(log_file=self.log_file))
        props = self.data_dir / "server.properties"
        lines = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir / "logs"),
            "num.partitions": "1",
            "auto.create.topics.enable": "true",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Compaction drills need the cleaner to act within a test, not after hours.
            "log.cleaner.backoff.ms": "500",
        }
        if self.scram_users:
            sasl = f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}"
            lines["listeners"] += f",{sasl}"
            lines["advertised.listeners"] += f",{sasl}"
            lines["listener.security.protocol.map"] += ",SASL_PLAINTEXT:SASL_PLAINTEXT"
            lines["sasl.enabled.mechanisms"] = "SCRAM-SHA-512"
            lines["listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;")
        props.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
        return props

    def _java_cmd(self, main: str, *args: str) -> list[str]:
        return [
            "java", f"-Xmx{self.heap}", "-Xms128m", "-XX:+UseG1GC",
            "-XX:TieredStopAtLevel=1" if main != "kafka.Kafka" or self.c1
            else "-XX:+UseStringDeduplication",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-Djava.awt.headless=true",
            "-cp", f"{jars_dir('kafka')}/*", main, *args,
        ]

    def _java(self, main: str, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(self._java_cmd(main, *args), capture_output=True, timeout=120)

    def _wait_ready(
        self, began: float, timeout: float, proc: subprocess.Popen[bytes] | None = None
    ) -> None:
        from confluent_kafka.admin import AdminClient

        while time.monotonic() - began < timeout:
            if proc is not None and proc.poll() is not None:
                tail = (self.data_dir / "broker.stdout").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"kafka broker exited with {proc.returncode}:\n{tail}")
            if self.port and port_open(self.port):
                try:
                    AdminClient({"bootstrap.servers": self.bootstrap_servers}).list_topics(
                        timeout=2
                    )
                    return
                except Exception:  # not ready yet; retried until timeout
                    pass
            time.sleep(0.2)
        raise TimeoutError(f"kafka broker on {self.bootstrap_servers} not ready in {timeout}s")


def create_topics(bootstrap: str, names: list[str], partitions: int = 1,
                  timeout: float = 60.0, **config: str) -> None:
    """Create the topics `names` (each with `partitions` and topic `config`) and wait."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [NewTopic(name, partitions, config=config) for name in names]
    for future in admin.create_topics(new).values():
        future.result(timeout)


def create_topic(bootstrap: str, prefix: str, partitions: int = 1, timeout: float = 60.0,
                 **config: str) -> str:
    """A new topic named `<prefix>-<8 hex digits>`, created and waited for; its name."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [name], partitions, timeout, **config)
    return name


def _cluster_id() -> str:
    # Kafka wants a base64url-encoded 16-byte UUID without padding.
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def abort_transaction(producer: Producer, timeout: float = 30.0) -> None:
    """Abort `producer`'s open transaction after its records are written, so the log
    keeps them (offsets nobody reads under read_committed) and the abort is one the
    coordinator accepts.

    librdkafka adds a partition to the transaction with its first record. Right after a
    commit the coordinator is still writing that commit's markers and answers the
    AddPartitionsToTxn with CONCURRENT_TRANSACTIONS; an abort sent then reaches a
    coordinator that never saw this transaction begin, and it answers INVALID_TXN_STATE,
    which librdkafka treats as fatal (confluentinc/librdkafka#4849). Once the records
    are delivered the partition is in the transaction, and the abort is valid.
    """
    undelivered = producer.flush(timeout)
    if undelivered:
        raise RuntimeError(f"{undelivered} transactional record(s) not delivered in {timeout}s")
    producer.abort_transaction(timeout)
