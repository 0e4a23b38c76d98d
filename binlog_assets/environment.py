"""Where binlake runs: project paths, and the Kafka cluster its clients talk to.

The ground floor every layer may import. Jars resolved by Maven live under
`.cache/jars/<classpath>` and runtime state (broker logs, the Dagster instance, the local
lakehouse) under `var/`; both are git-ignored, and `BINLAKE_CACHE_DIR` / `BINLAKE_VAR_DIR`
move them (tests point them at temporary directories). The Kafka cluster is the
configured one, or the embedded broker that the dev stack (`binlog_assets.dev`) starts
under `var/kafka`: this module reads its port file, it never starts anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from binlog_assets.config import PipelineConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
# The embedded broker's files under its directory: `<stem>.pid`, `<stem>.port`.
EMBEDDED_BROKER_STEM = "broker"


def cache_dir() -> Path:
    return Path(os.environ.get("BINLAKE_CACHE_DIR", REPO_ROOT / ".cache"))


def var_dir() -> Path:
    return Path(os.environ.get("BINLAKE_VAR_DIR", REPO_ROOT / "var"))


def jars_dir(classpath: str) -> Path:
    """The local folder of one Maven-resolved classpath (`kafka`, `delta`, ...).

    Raises FileNotFoundError with the set-up command when it has not been fetched, so a
    missing jar never turns into a silent download at run time.
    """
    path = cache_dir() / "jars" / classpath
    if not path.is_dir() or not any(path.glob("*.jar")):
        raise FileNotFoundError(
            f"no jars in {path}: run `make setup` (it resolves setup/maven/{classpath}/pom.xml)"
        )
    return path


def embedded_broker_dir() -> Path:
    return var_dir() / "kafka"


def live_pid(pid_file: Path, marker: str) -> int | None:
    """The pid in `pid_file` if that process is alive and its command line holds `marker`.

    The marker (a path the process was started with) keeps a stale pid file, whose pid
    the system has since given to something else, from passing for our server.
    """
    try:
        pid = int(pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    if marker.encode() not in cmdline:
        return None
    return pid


def kafka_client_config(pipeline: PipelineConfig) -> dict[str, str | int | float | bool]:
    """The librdkafka settings for this config, pointing at the embedded broker when no
    `bootstrap.servers` is configured. Fails clearly when that broker is not running."""
    conf = dict(pipeline.kafka)
    if not pipeline.bootstrap_servers:
        home = embedded_broker_dir()
        port = home / f"{EMBEDDED_BROKER_STEM}.port"
        if live_pid(home / f"{EMBEDDED_BROKER_STEM}.pid", str(home)) is None or \
                not port.exists():
            raise RuntimeError(
                "kafka.bootstrap.servers is not configured and the embedded broker is not "
                "running: start it with `make stack-up` (or set kafka.bootstrap.servers)"
            )
        conf["bootstrap.servers"] = f"127.0.0.1:{port.read_text().strip()}"
    return conf
