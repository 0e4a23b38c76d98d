"""Start, stop and report the embedded local stack: `python -m binlog_assets.dev.stack up`.

Only what the config leaves local is started: with `kafka.bootstrap.servers` set, the
user's cluster is used and no broker starts here. State lives under `var/`.
"""

from __future__ import annotations

import argparse
import sys

from binlog_assets.config import PipelineConfig, load_config
from binlog_assets.dev.kafka import KafkaBroker
from binlog_assets.dev.paths import var_dir


def local_broker() -> KafkaBroker:
    return KafkaBroker(var_dir() / "kafka")


def kafka_client_config(config: PipelineConfig) -> dict[str, str | int | float | bool]:
    """The librdkafka settings for this config, pointing at the embedded broker when no
    `bootstrap.servers` is configured. Fails clearly when that broker is not running."""
    conf = dict(config.kafka)
    if not config.bootstrap_servers:
        broker = local_broker()
        if broker.running_pid() is None or not broker.port_file.exists():
            raise RuntimeError(
                "kafka.bootstrap.servers is not configured and the embedded broker is not "
                "running: start it with `make stack-up` (or set kafka.bootstrap.servers)"
            )
        conf["bootstrap.servers"] = f"127.0.0.1:{broker.port_file.read_text().strip()}"
    return conf


def up(config: PipelineConfig) -> str:
    if config.bootstrap_servers:
        return f"kafka: using configured bootstrap.servers={config.bootstrap_servers}"
    broker = local_broker()
    seconds = broker.start()
    return f"{broker.status()} (ready in {seconds:.1f}s)"


def down(config: PipelineConfig) -> str:
    if config.bootstrap_servers:
        return "kafka: configured cluster, nothing local to stop"
    local_broker().stop()
    return local_broker().status()


def status(config: PipelineConfig) -> str:
    if config.bootstrap_servers:
        return f"kafka: configured bootstrap.servers={config.bootstrap_servers}"
    return local_broker().status()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="binlake-stack", description=__doc__)
    parser.add_argument("action", choices=["up", "down", "status"])
    args = parser.parse_args(argv)
    config = load_config()
    print({"up": up, "down": down, "status": status}[args.action](config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
