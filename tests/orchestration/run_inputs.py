"""What a consume-run test feeds its run: Debezium inserts on each partition of a topic,
and a config file for the run (a group and a database of its own); and what the run
wrote to the changelog."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson
import yaml
from confluent_kafka import Producer

from binlog_assets.config import PipelineConfig
from binlog_assets.environment import REPO_ROOT
from binlog_assets.lakehouse.changelog import changelog_uri
from binlog_assets.lakehouse.delta_log import delta_rs_uri


def produce_inserts(bootstrap: str, topic: str, per_partition: dict[int, int],
                    id_base: int = 100) -> None:
    """`per_partition[p]` inserts of table `shop.t` on partition p, ids from p * id_base."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for partition, n in per_partition.items():
        for i in range(n):
            row = {"id": partition * id_base + i, "v": i}
            value = {"before": None, "after": row, "op": "c", "ts_ms": i,
                     "source": {"db": "shop", "table": "t", "file": "mysql-bin.000001",
                                "pos": 100 + i, "row": 0, "snapshot": "false"}}
            p.produce(topic, partition=partition, key=orjson.dumps({"id": row["id"]}),
                      value=orjson.dumps(value))
    assert p.flush(30) == 0


def run_config_file(pipeline_config: PipelineConfig, tmp_path: Path, source: dict,
                    **sections: dict) -> Path:
    """`binlake.yaml` in tmp_path: the test's config with one source, its own group and
    database (named after the source), and `sections` (e.g. `dagster={...}`) set."""
    data = pipeline_config.model_dump(mode="json", exclude_none=True)
    data["kafka"]["group.id"] = f"g-{uuid.uuid4().hex[:6]}"
    data["lakehouse"]["database"] = f"{source['name']}_{uuid.uuid4().hex[:6]}"
    data["sources"] = [{"format": "debezium", **source}]
    data.update(sections)
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def dagster_dev_env(pipeline_config: PipelineConfig, tmp_path: Path, source: dict,
                    location: str, **sections: dict) -> tuple[dict[str, str], Path]:
    """What `dagster dev` needs in tmp_path: an instance with the shipped dagster.yaml, a
    config (`run_config_file`, its lakehouse in tmp_path) and a workspace loading the
    pipeline as `location`; returns the environment and the workspace file."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "setup" / "dagster.yaml", home / "dagster.yaml")
    lakehouse = {"path": str(tmp_path / "lake"), "database": source["name"]}
    path = run_config_file(pipeline_config, tmp_path, source,
                           **{"lakehouse": lakehouse, **sections})
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(yaml.safe_dump({"load_from": [{"python_module": {
        "module_name": "binlog_assets.definitions", "location_name": location,
        "working_directory": str(REPO_ROOT)}}]}))
    env = {**os.environ, "DAGSTER_HOME": str(home), "BINLAKE_CONFIG": str(path),
           "BINLAKE_VAR_DIR": str(tmp_path / "var")}
    return env, workspace


def changelog_coordinates(pipeline: PipelineConfig) -> Counter:
    """(partition, offset) -> rows of the changelog (delta-rs), empty before its first write."""
    from deltalake import DeltaTable

    uri = delta_rs_uri(changelog_uri(pipeline))
    if not DeltaTable.is_deltatable(uri):
        return Counter()
    rows = DeltaTable(uri).to_pyarrow_table(columns=["partition", "offset"]).to_pylist()
    return Counter((r["partition"], r["offset"]) for r in rows)


def handlers_run(pipeline_config: PipelineConfig, tmp_path: Path, name: str,
                 per_partition: dict[int, int], **source: object) -> tuple[Path, list[str], Path]:
    """A topic `name` with `per_partition` inserts, and a config whose runs handle them with
    `worker_handlers:registry` (`source` adds to the source's settings) and use one
    worker process for any backlog; returns the config's path, the partition keys and
    the (empty) file the handlers write."""
    from binlog_assets.dev.kafka import create_topic
    from binlog_assets.orchestration.partitions import partition_key

    bootstrap = pipeline_config.bootstrap_servers
    topic = create_topic(bootstrap, name, partitions=len(per_partition))
    produce_inserts(bootstrap, topic, per_partition, id_base=10_000)
    config_path = run_config_file(
        pipeline_config, tmp_path,
        {"name": name, "topics": [topic], "handlers": "worker_handlers:registry",
         "tables": [{"source": "shop.t", "replica": "t"}], **source},
        dagster={"worker_processes": 1, "worker_backlog_records": 1})
    handled = tmp_path / "handled.txt"
    handled.touch()
    return config_path, [partition_key(topic, p) for p in per_partition], handled


def handled_events(path: Path) -> list[tuple[int, int, int]]:
    """(pid, partition, offset) of each event the handlers wrote to `path`."""
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()]


def interrupt_when(child: subprocess.Popen, ready: Callable[[], bool],
                   timeout: float) -> tuple[float, str]:
    """SIGINT `child` (what Dagster's Terminate does to a run's process) once `ready()`
    holds; returns how long it took to end after that, and its stderr."""
    try:
        deadline = time.monotonic() + timeout
        while not ready() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.1)
        assert ready(), child.communicate(timeout=30)
        child.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        _out, err = child.communicate(timeout=300)
        return time.monotonic() - interrupted, err
    finally:
        if child.poll() is None:
            child.kill()
