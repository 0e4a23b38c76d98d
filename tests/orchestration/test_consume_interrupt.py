"""A terminated consume run ends soon and keeps what it finished.

Dagster terminates a run by interrupting its process (SIGINT, raised in the step as
`DagsterExecutionInterruptedError`). The run then starts no more partitions, stops the
ones it reads (in its threads and in its worker process) at their next batch, commits
what their handlers finished to the changelog and to Kafka, records it as each
partition's metadata, and ends. The next run goes on from there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import dagster as dg
import pytest
from run_inputs import changelog_coordinates, handled_events, handlers_run, interrupt_when

from binlog_assets.config import PipelineConfig, load_config
from binlog_assets.consume.lag import measure_lag
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME

CHILD = Path(__file__).with_name("consume_child.py")
# The run's four threads and its worker take five partitions; the sixth waits its turn.
# Handled in order, one event at a time at 20 ms each, a partition takes 12 s to read to
# its end, and what is handled is a contiguous prefix.
PER_PARTITION = dict.fromkeys(range(6), 600)


@pytest.mark.timeout(300)
def test_an_interrupted_run_commits_what_its_handlers_finished_and_ends(
        pipeline_config: PipelineConfig, tmp_path: Path) -> None:
    config_path, keys, handled = handlers_run(pipeline_config, tmp_path, "stop",
                                              PER_PARTITION, ordering="partition")
    topic = keys[0].rsplit(":", 1)[0]
    home = tmp_path / "dagster"
    home.mkdir()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, keys)
    env = {**os.environ, "BINLAKE_CONFIG": str(config_path), "DAGSTER_HOME": str(home),
           "BINLAKE_TEST_HANDLED": str(handled), "BINLAKE_TEST_HANDLER_MS": "20",
           "BINLAKE_TEST_HANDLER_ONE_BY_ONE": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}

    child = subprocess.Popen([sys.executable, str(CHILD), keys[0], keys[-1]], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def busy() -> bool:  # the worker and the run's threads have each handled an event
        events = handled_events(handled)
        pids = {pid for pid, _, _ in events}
        started = {p for _, p, _ in events}
        # On a loaded host a thread's partition can start later than the others': the
        # interrupt waits for all five, or one would end with nothing committed.
        return child.pid in pids and len(pids) == 2 and started == set(range(5))

    ended, err = interrupt_when(child, busy, timeout=120)
    # Reading on would have taken 12 s for the partitions running and 12 more for the
    # sixth: the run ended at the running events instead.
    assert ended < 8, f"the run ended {ended:.1f}s after its interrupt: {err[-3000:]}"

    pipeline = load_config(config_path)
    group = pipeline.kafka["group.id"]
    writer = ChangelogWriter(pipeline)
    changelog = {p: writer.checkpoint(group, topic, p) for p in PER_PARTITION}
    kafka = {pl.partition: pl.committed for pl in measure_lag(dict(pipeline.kafka), group, [topic])}
    assert kafka == changelog, (kafka, changelog)
    # The sixth partition was never started; the others committed a part of theirs.
    assert changelog[5] is None, changelog
    assert all(0 < changelog[p] < 600 for p in range(5)), changelog
    # Exactly the committed prefix of each partition is in the changelog, once.
    assert changelog_coordinates(pipeline) == Counter(
        {(p, o): 1 for p in range(5) for o in range(changelog[p])})
    # What was committed is what the handlers finished, each event once.
    assert Counter((p, o) for _pid, p, o in handled_events(handled)) == Counter(
        {(p, o): 1 for p in range(5) for o in range(changelog[p])})

    with dg.DagsterInstance.from_config(str(home)) as instance:
        for p in range(5):
            (record,) = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("changelog"),
                                      asset_partitions=[keys[p]]), limit=5).records
            md = record.asset_materialization.metadata
            assert md["stop_reason"].value == "interrupted"
            assert md["committed_offset"].value == changelog[p]
        (run,) = instance.get_run_records()
        assert run.dagster_run.status != dg.DagsterRunStatus.SUCCESS

    # The next run goes on from there: every event in the changelog exactly once.
    env["BINLAKE_TEST_HANDLER_MS"] = "0"
    rerun = subprocess.run([sys.executable, str(CHILD), keys[0], keys[-1]], env=env,
                           capture_output=True, text=True, timeout=240)
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    (line,) = [ln for ln in rerun.stdout.splitlines() if ln.startswith("CONSUME-RESULT ")]
    assert json.loads(line.split(" ", 1)[1])["success"], rerun.stderr[-4000:]
    assert changelog_coordinates(pipeline) == Counter(
        {(p, o): 1 for p, n in PER_PARTITION.items() for o in range(n)})
    assert {p: writer.checkpoint(group, topic, p) for p in PER_PARTITION} == PER_PARTITION
