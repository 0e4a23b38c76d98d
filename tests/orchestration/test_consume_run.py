"""A real Dagster run of the consume job over a range of partitions: no JVM, exit 0.

The run worker's process loads the code location and runs the job the way `dagster dev`
would launch it (`consume_child.py`); the test reads what it wrote back from the
instance (one materialization per partition, with that partition's metadata), from the
changelog's Delta log (delta-rs) and from the consumer group's committed offsets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import dagster as dg
from run_inputs import produce_inserts, run_config_file

from binlog_assets.config import PipelineConfig, load_config
from binlog_assets.consume.lag import measure_lag
from binlog_assets.dev.kafka import create_topic
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME, partition_key

CHILD = Path(__file__).with_name("consume_child.py")
PER_PARTITION = {0: 7, 1: 0, 2: 5}  # partition 1 is idle: a range carries it along


def _run_env(tmp_path: Path, config_path: Path, keys: list[str]) -> tuple[dict, Path]:
    """The environment of a run worker over `keys`: the config, and an instance of its
    own that knows the partitions."""
    home = tmp_path / "dagster"
    home.mkdir()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, keys)
    return {**os.environ, "BINLAKE_CONFIG": str(config_path), "DAGSTER_HOME": str(home)}, home


def _child(env: dict[str, str], first: str, last: str) -> tuple[dict, subprocess.CompletedProcess]:
    proc = subprocess.run([sys.executable, str(CHILD), first, last], env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CONSUME-RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1].split(" ", 1)[1]), proc


def test_one_run_consumes_a_range_of_partitions_without_a_jvm(
        pipeline_config: PipelineConfig, tmp_path: Path) -> None:
    bootstrap = pipeline_config.bootstrap_servers
    topic = create_topic(bootstrap, "multi", partitions=3)
    produce_inserts(bootstrap, topic, PER_PARTITION)
    config_path = run_config_file(pipeline_config, tmp_path, {"name": "multi", "topics": [topic]})
    keys = [partition_key(topic, p) for p in PER_PARTITION]
    env, home = _run_env(tmp_path, config_path, keys)

    result, proc = _child(env, keys[0], keys[-1])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert result["success"], proc.stderr[-4000:]
    # No Spark anywhere in the run: not imported, and no JVM (or any process) launched.
    assert result["pyspark"] == []
    assert not [argv for argv in result["launched"]
                if any("java" in a or "spark" in a for a in argv)], result["launched"]

    pipeline = load_config(config_path)
    writer = ChangelogWriter(pipeline)
    group = pipeline.kafka["group.id"]
    assert {p: writer.checkpoint(group, topic, p) for p in PER_PARTITION} == {0: 7, 1: None,
                                                                             2: 5}
    committed = {pl.partition: pl.committed for pl in measure_lag(dict(pipeline.kafka), group,
                                                                   [topic])}
    assert committed == {0: 7, 1: None, 2: 5}
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for partition, n in PER_PARTITION.items():
            records = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("changelog"),
                                      asset_partitions=[keys[partition]]), limit=5).records
            assert len(records) == 1, keys[partition]
            md = records[0].asset_materialization.metadata
            assert md["records"].value == n
            assert md["committed_offset"].value == n
            # Not a number: the UI would plot a partition's constant number over time.
            assert md["partition"].value == str(partition)
            assert md["consume_seconds"].value >= 0
            assert 0 <= md["kafka_wait_seconds"].value <= md["consume_seconds"].value
            # Dagster's standard row count: the changelog's rows (one event per record).
            assert md["dagster/row_count"].value == sum(PER_PARTITION.values())
        # Where each partition stands, one numeric key per partition (a plot each) and
        # one table, on the source's Kafka asset.
        (obs,) = instance.fetch_observations(dg.AssetKey(["kafka", "multi"]), limit=5).records
        md = obs.asset_observation.metadata
        for partition, n in PER_PARTITION.items():
            assert md[f"committed_offset/{keys[partition]}"].value == n
            assert md[f"lag_records/{keys[partition]}"].value == 0
        assert md["total_lag_records"].value == 0
        rows = {r.data["partition"]: r.data for r in md["partitions"].records}
        assert {k: (r["committed_offset"], r["end_offset"], r["lag"], r["dead_lettered"])
                for k, r in rows.items()} == {keys[p]: (n, n, 0, 0)
                                              for p, n in PER_PARTITION.items()}
        assert all(r["last_run"].startswith(result["run_id"][:8]) for r in rows.values())

    # A second run over the same range reads nothing new and still exits cleanly.
    again, proc = _child(env, keys[0], keys[-1])
    assert proc.returncode == 0 and again["success"], proc.stderr[-4000:]
    assert {p: writer.checkpoint(group, topic, p) for p in PER_PARTITION} == {0: 7, 1: None,
                                                                             2: 5}
    # It consumed nothing: observations, and no materialization to start downstream work.
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for key in keys:
            assert len(instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("changelog"),
                                      asset_partitions=[key]), limit=5).records) == 1
            (seen,) = instance.fetch_observations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("changelog"),
                                      asset_partitions=[key]), limit=5).records
            assert seen.asset_observation.metadata["records"].value == 0
        assert len(instance.fetch_observations(dg.AssetKey(["kafka", "multi"]),
                                               limit=5).records) == 2


def test_a_failing_partition_fails_the_run_and_the_others_keep_their_metadata(
        pipeline_config: PipelineConfig, tmp_path: Path) -> None:
    from binlog_assets.orchestration.changelog_asset import changelog
    from binlog_assets.orchestration.resources import BinlakeResource
    from binlog_assets.orchestration.shared import RANGE_END_TAG, RANGE_START_TAG

    bootstrap = pipeline_config.bootstrap_servers
    topic = create_topic(bootstrap, "multi", partitions=3)
    produce_inserts(bootstrap, topic, PER_PARTITION)
    config_path = run_config_file(pipeline_config, tmp_path, {"name": "multi", "topics": [topic]})
    # The middle partition's topic belongs to no configured source: that partition fails.
    keys = [partition_key(topic, 0), "unconfigured-topic:0", partition_key(topic, 2)]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, keys)
        result = dg.materialize(
            [changelog], instance=instance, raise_on_error=False,
            resources={"binlake": BinlakeResource(config_path=str(config_path))},
            tags={RANGE_START_TAG: keys[0], RANGE_END_TAG: keys[-1]})
        assert not result.success
        failure = result.get_step_failure_events()[0].step_failure_data.error.cause
        assert "1 of 3 partitions failed: unconfigured-topic:0" in failure.message
        for key, n in ((keys[0], PER_PARTITION[0]), (keys[2], PER_PARTITION[2])):
            (record,) = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("changelog"),
                                      asset_partitions=[key]), limit=5).records
            assert record.asset_materialization.metadata["committed_offset"].value == n
        assert not instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("changelog"),
                                  asset_partitions=[keys[1]]), limit=5).records


def test_the_sources_handlers_run_once_opened_with_metrics_and_named_dead_letters(
        pipeline_config: PipelineConfig, tmp_path: Path) -> None:
    from confluent_kafka import Consumer
    from run_handlers import BAD_ID, Counting

    from binlog_assets.dev.kafka import create_topics
    from binlog_assets.orchestration.changelog_asset import changelog
    from binlog_assets.orchestration.resources import BinlakeResource
    from binlog_assets.orchestration.shared import RANGE_END_TAG, RANGE_START_TAG

    bootstrap = pipeline_config.bootstrap_servers
    topic = create_topic(bootstrap, "handled", partitions=3)
    dlq = f"dlq-{uuid.uuid4().hex[:6]}"
    create_topics(bootstrap, [dlq])
    produce_inserts(bootstrap, topic, PER_PARTITION)
    config_path = run_config_file(pipeline_config, tmp_path, {
        "name": "handled", "topics": [topic], "handlers": "run_handlers:registry",
        "max_retries": 1, "dead_letter_topic": dlq,
        "tables": [{"source": "shop.t", "replica": "t"}]})
    keys = [partition_key(topic, p) for p in PER_PARTITION]
    Counting.opened = Counting.closed = 0
    Counting.seen.clear()
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, keys)
        result = dg.materialize(
            [changelog], instance=instance,
            resources={"binlake": BinlakeResource(config_path=str(config_path))},
            tags={RANGE_START_TAG: keys[0], RANGE_END_TAG: keys[-1]})
        assert result.success
        mds = {m.partition: m.metadata
               for m in result.asset_materializations_for_node("changelog")}
    # Three partitions, one run: the handler objects opened once and closed once.
    assert (Counting.opened, Counting.closed) == (1, 1)
    # Every row once, and the refused row twice: its batch failed (on `picky`) and was
    # replayed one event at a time, through every handler of the table.
    assert sorted(Counting.seen) == sorted([BAD_ID] + [p * 100 + i for p, n in
                                                       PER_PARTITION.items() for i in range(n)])
    md = mds[keys[0]]
    assert md["handler.counting.events"].value == PER_PARTITION[0]
    assert md["handler.picky.events"].value == PER_PARTITION[0] - 1
    assert md["handler.picky.dead_lettered"].value == 1
    assert md["handler.picky.retries"].value == 1
    assert md["handler.picky.p99_ms"].value >= md["handler.picky.p50_ms"].value >= 0
    assert (md["dead_lettered"].value, md["breakers_open"].value) == (1, 0)
    # Op counts by name, zeros included; events per table as a table.
    assert (md["inserts"].value, md["updates"].value, md["deletes"].value,
            md["truncates"].value, md["ddl"].value) == (PER_PARTITION[0], 0, 0, 0, 0)
    [per_table] = md["per_table"].value.records
    assert (per_table.data["table"], per_table.data["inserts"]) == ("shop.t", PER_PARTITION[0])
    assert mds[keys[1]]["inserts"].value == 0
    assert "handler.picky.events" not in mds[keys[1]]  # an idle partition calls nothing
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([dlq])
        msg = None
        for _ in range(30):
            msg = consumer.poll(1)
            if msg is not None and not msg.error():
                break
        assert msg is not None and not msg.error()
        headers = {k: v.decode() for k, v in msg.headers()}
    finally:
        consumer.close()
    assert headers["binlake.handler"] == "picky"
    assert headers["binlake.reason"] == "retries_exhausted"
    assert headers["binlake.offset"] == str(BAD_ID)
    assert headers["binlake.stage"] == "handler"


def test_a_run_with_worker_processes_reports_every_partition_and_exits_0(
        pipeline_config: PipelineConfig, tmp_path: Path) -> None:
    """The same run with a worker process for any backlog: partitions consumed there
    report their metadata through the run like the others, and the run exits 0."""
    per_partition = {0: 7, 1: 0, 2: 5, 3: 3, 4: 4}  # the run's four threads take one each
    bootstrap = pipeline_config.bootstrap_servers
    topic = create_topic(bootstrap, "multi", partitions=len(per_partition))
    produce_inserts(bootstrap, topic, per_partition)
    config_path = run_config_file(
        pipeline_config, tmp_path, {"name": "multi", "topics": [topic]},
        dagster={"worker_processes": 1, "worker_backlog_records": 1})
    keys = [partition_key(topic, p) for p in per_partition]
    env, home = _run_env(tmp_path, config_path, keys)

    result, proc = _child(env, keys[0], keys[-1])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert result["success"] and result["pyspark"] == [], proc.stderr[-4000:]
    pipeline = load_config(config_path)
    writer = ChangelogWriter(pipeline)
    assert {p: writer.checkpoint(pipeline.kafka["group.id"], topic, p)
            for p in per_partition} == {p: n or None for p, n in per_partition.items()}
    with dg.DagsterInstance.from_config(str(home)) as instance:
        logs = [e.user_message for e in instance.all_logs(result["run_id"])]
        assert [m for m in logs if "in a worker process" in m], logs
        for partition, n in per_partition.items():
            (record,) = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("changelog"),
                                      asset_partitions=[keys[partition]]), limit=5).records
            md = record.asset_materialization.metadata
            assert (md["records"].value, md["committed_offset"].value) == (n, n)
