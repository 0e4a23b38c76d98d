"""Two runs of one partition at once: one commits, the other is fenced (invariant 4).

Also the drill "a second run started on the same partition": its figures (trials,
fenced runs, changelog rows, duplicate coordinates) go to the drill report; `make
drills-long` runs more trials.
"""

import os
import threading
import time
import uuid

import orjson
import pytest
from changelog_reads import changelog_frame
from confluent_kafka import Producer

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.run import RunSummary
from binlog_assets.dev import drills
from binlog_assets.dev.kafka import create_topic
from binlog_assets.lakehouse.fence import FencedRunError
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.orchestration.partitions import partition_key
from binlog_assets.rounds.round import consume_partition


def slow_registry() -> HandlerRegistry:
    """Handlers slow enough that both runs are mid-flight at once."""
    registry = HandlerRegistry()
    registry.register(r".*", lambda event: time.sleep(0.002), name="slow")
    return registry


def test_two_runs_on_one_partition_one_is_fenced(pipeline_config: PipelineConfig,
                                                  spark) -> None:
    _fencing_drill(pipeline_config, spark, 1, "second_run_fenced")


@pytest.mark.long
def test_two_runs_on_one_partition_one_is_fenced_long(pipeline_config: PipelineConfig,
                                                       spark) -> None:
    _fencing_drill(pipeline_config, spark,
                   int(os.environ.get("BINLAKE_DRILL_TRIALS") or 3), "second_run_fenced_long")


def _fencing_drill(pipeline_config: PipelineConfig, spark, trials: int, name: str) -> None:
    figures = {"trials": 0, "fenced": 0, "committed": 0, "changelog_rows": 0,
               "duplicate_coordinates": 0, "seconds": 0.0}
    try:
        for _ in range(trials):
            began = time.monotonic()
            fenced, committed, rows, distinct = _race(pipeline_config, spark)
            figures["trials"] += 1
            figures["fenced"] += fenced
            figures["committed"] += committed
            figures["changelog_rows"] += rows
            figures["duplicate_coordinates"] += rows - distinct
            figures["seconds"] += round(time.monotonic() - began, 1)
    finally:
        drills.record(name, figures)


def _race(pipeline_config: PipelineConfig, spark) -> tuple[int, int, int, int]:
    """Two runs race on a fresh partition; (fenced runs, committed runs, changelog rows,
    distinct coordinates)."""
    bootstrap = pipeline_config.bootstrap_servers
    topic = create_topic(bootstrap, "fence")
    p = Producer({"bootstrap.servers": bootstrap})
    n = 3000
    for i in range(n):
        value = {"before": None, "after": {"id": i % 100, "v": i}, "op": "c", "ts_ms": i,
                 "source": {"db": "fence", "table": "t", "file": "mysql-bin.000001",
                            "pos": 100 + i, "row": 0, "snapshot": "false"}}
        p.produce(topic, key=orjson.dumps({"id": i % 100}), value=orjson.dumps(value))
    assert p.flush(30) == 0

    data = pipeline_config.model_dump(mode="json", exclude_none=True)
    data["kafka"]["group.id"] = f"g-{uuid.uuid4().hex[:6]}"
    data["sources"] = [{"name": "fence", "topics": [topic], "format": "debezium", "lanes": 4,
                        "max_in_flight": 500}]
    pipeline = parse_config(data)
    key = partition_key(topic, 0)

    # Both runs resolve the same checkpoint and race for the same range. (Two Dagster
    # runs in one process would deadlock on Python's logging lock, and two processes on
    # the embedded Derby catalog, so the runs are the asset's own code in two threads.)
    outcomes: dict[int, object] = {}
    start = threading.Barrier(2)

    def launch(i: int) -> None:
        start.wait()
        try:
            outcomes[i] = consume_partition(pipeline, dict(pipeline.kafka), key,
                                            ChangelogRunConfig(), slow_registry(),
                                            group=pipeline.kafka["group.id"])[0]
        except Exception as e:  # the outcome is what the test checks
            outcomes[i] = e

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)

    fenced = [o for o in outcomes.values() if isinstance(o, Exception)]
    committed = [o for o in outcomes.values() if isinstance(o, RunSummary)]
    assert len(fenced) == 1 and len(committed) == 1, outcomes
    assert isinstance(fenced[0], FencedRunError), repr(fenced[0])
    assert committed[0].committed_offset == n

    rows = changelog_frame(spark, pipeline).where(f"topic = '{topic}'")
    count = rows.count()
    distinct = rows.select("partition", "offset", "row_index").distinct().count()
    assert count == n
    assert distinct == n
    return len(fenced), len(committed), count, distinct
