"""Replay: a run config that starts a partition from an offset or a timestamp.

A replay runs the handlers again over the chosen range (that is what it is for: a fixed
handler, a rebuilt downstream system), while the changelog stays exactly once: rows it
already holds are not appended again, and the checkpoint ends where the run ends.
"""

import uuid

import orjson
from changelog_reads import changelog_checkpoint, changelog_frame
from confluent_kafka import Producer

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.dev.kafka import create_topic
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.orchestration.partitions import partition_key
from binlog_assets.rounds.round import consume_partition

N = 40
T0 = 1_760_000_000_000  # record i is stamped T0 + i * 1000 ms


def _setup(pipeline_config: PipelineConfig) -> tuple[PipelineConfig, str]:
    bootstrap = pipeline_config.bootstrap_servers
    topic = create_topic(bootstrap, "replay")
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(N):
        value = {"before": None, "after": {"id": i, "v": i}, "op": "c", "ts_ms": i,
                 "source": {"db": "replay", "table": "t", "file": "mysql-bin.000001",
                            "pos": 100 + i, "row": 0, "snapshot": "false"}}
        p.produce(topic, key=orjson.dumps({"id": i}), value=orjson.dumps(value),
                  timestamp=T0 + i * 1000)
    assert p.flush(30) == 0
    data = pipeline_config.model_dump(mode="json", exclude_none=True)
    data["kafka"]["group.id"] = f"g-{uuid.uuid4().hex[:6]}"
    data["lakehouse"]["database"] = f"replay_{uuid.uuid4().hex[:6]}"
    data["sources"] = [{"name": "replay", "topics": [topic], "format": "debezium"}]
    return parse_config(data), topic


def _run(pipeline: PipelineConfig, spark, topic: str, run_config: ChangelogRunConfig
         ) -> tuple[list[int], object]:
    seen: list[int] = []
    registry = HandlerRegistry()
    registry.register(r".*", lambda event: seen.append(event.after["id"]), name="record")
    summary, _ = consume_partition(pipeline, dict(pipeline.kafka), partition_key(topic, 0),
                                   run_config, registry, group=pipeline.kafka["group.id"])
    return sorted(seen), summary


def test_replay_from_an_offset_and_from_a_timestamp(pipeline_config, spark) -> None:
    pipeline, topic = _setup(pipeline_config)
    seen, summary = _run(pipeline, spark, topic, ChangelogRunConfig())
    assert seen == list(range(N))
    assert summary.committed_offset == N

    # Nothing new: a plain run reads nothing.
    seen, summary = _run(pipeline, spark, topic, ChangelogRunConfig())
    assert seen == [] and summary.start_offset == N

    seen, summary = _run(pipeline, spark, topic, ChangelogRunConfig(start_offset=25))
    assert seen == list(range(25, N))
    assert summary.start_offset == 25 and summary.committed_offset == N

    # The first record stamped at or after T0 + 12.5 s is offset 13.
    seen, summary = _run(pipeline, spark, topic,
                         ChangelogRunConfig(start_timestamp_ms=T0 + 12_500))
    assert seen == list(range(13, N))
    assert summary.start_offset == 13

    rows = changelog_frame(spark, pipeline).where(f"topic = '{topic}'")
    assert rows.count() == N  # the replays appended nothing twice
    assert rows.select("offset").distinct().count() == N
    assert changelog_checkpoint(pipeline, pipeline.kafka["group.id"], topic, 0) == N
