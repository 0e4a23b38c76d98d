"""What a consume-run test feeds its run: Debezium inserts on each partition of a topic,
and a config file for the run (a group and a database of its own); and what the run
wrote to the changelog."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import orjson
import yaml
from confluent_kafka import Producer

from binlog_assets.config import PipelineConfig
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


def changelog_coordinates(cfg: PipelineConfig) -> Counter:
    """(partition, offset) -> rows of the changelog (delta-rs), empty before its first write."""
    from deltalake import DeltaTable

    uri = delta_rs_uri(changelog_uri(cfg))
    if not DeltaTable.is_deltatable(uri):
        return Counter()
    rows = DeltaTable(uri).to_pyarrow_table(columns=["partition", "offset"]).to_pylist()
    return Counter((r["partition"], r["offset"]) for r in rows)
