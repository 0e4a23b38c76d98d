"""What the Dagster UI shows, read through its own GraphQL API on a real `dagster dev`.

`dagster dev` (webserver + daemon) runs the pipeline's code location over a fresh
instance and a fresh topic; the daemon's lag sensor launches the consumer run. The test
then asks the webserver what a user's pages would show: the run's tags (why the sensor
requested it), the changelog's and the Kafka source's metadata entries with their
types (numbers stay numbers, tables are tables, constants are not numbers), the
changelog's table metadata, the sensor's skip reasons, and that a run which consumed
nothing (launched as the launchpad does) records no materialization.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg
import orjson
import pytest
from confluent_kafka import Producer
from run_inputs import dagster_dev_env

from binlog_assets.config import PipelineConfig
from binlog_assets.dev.kafka import create_topic
from binlog_assets.dev.process import free_port
from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME, partition_key

LOCATION = "binlake"
RECORDS = 6

ENTRIES = """
  __typename label
  ... on IntMetadataEntry { intValue }
  ... on FloatMetadataEntry { floatValue }
  ... on TextMetadataEntry { text }
  ... on PathMetadataEntry { path }
  ... on TableMetadataEntry { table { records } }
  ... on TableSchemaMetadataEntry { schema { columns { name type } } }
"""

ASSET_QUERY = """
query Asset($key: AssetKeyInput!) {
  assetOrError(assetKey: $key) {
    ... on Asset {
      assetMaterializations(limit: 20) { partition runId metadataEntries { ENTRIES } }
      assetObservations(limit: 20) { partition runId metadataEntries { ENTRIES } }
      definition { metadataEntries { ENTRIES } }
    }
  }
}
""".replace("ENTRIES", ENTRIES)

RUNS_QUERY = """
query Runs($job: String!) {
  runsOrError(filter: {pipelineName: $job}) {
    ... on Runs { results { runId status tags { key value } } }
  }
}
"""

TICKS_QUERY = """
query Ticks($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    ... on Sensor { sensorState { ticks(limit: 50) { status skipReason runIds } } }
  }
}
"""

LOCATIONS_QUERY = """
{ workspaceOrError { ... on Workspace { locationEntries {
    name locationOrLoadError { __typename ... on PythonError { message } } } } } }
"""

LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""


class UI:
    def __init__(self, port: int, proc: subprocess.Popen, log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}/graphql"
        self.proc, self.log = proc, log

    def query(self, text: str, **variables) -> dict:
        body = json.dumps({"query": text, "variables": variables}).encode()
        request = urllib.request.Request(self.url, data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            out = json.loads(response.read())
        assert "errors" not in out, out["errors"]
        return out["data"]

    def wait(self, what: str, predicate, timeout: float = 240):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = predicate()
            except OSError:  # the webserver is not up yet
                value = None
            if value:
                return value
            if self.proc.poll() is not None:
                pytest.fail(f"dagster dev exited:\n{self.log.read_text()[-4000:]}")
            time.sleep(1)
        pytest.fail(f"timed out waiting for {what}:\n{self.log.read_text()[-4000:]}")

    def loaded(self) -> None:
        """Wait for the code location; fail at once, with its error, when it fails."""
        def entry():
            found = self.query(LOCATIONS_QUERY)["workspaceOrError"]["locationEntries"]
            return [e["locationOrLoadError"] for e in found
                    if e["name"] == LOCATION and e["locationOrLoadError"]]

        (location,) = self.wait("the code location", entry)
        assert location["__typename"] == "RepositoryLocation", location

    def asset(self, *path: str) -> dict:
        return self.query(ASSET_QUERY, key={"path": list(path)})["assetOrError"]

    def runs(self, job: str) -> list[dict]:
        return self.query(RUNS_QUERY, job=job)["runsOrError"]["results"]

    def ticks(self, sensor: str) -> list[dict]:
        selector = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
                    "sensorName": sensor}
        found = self.query(TICKS_QUERY, selector=selector)["sensorOrError"]
        return found["sensorState"]["ticks"]


def _entries(event: dict) -> dict[str, dict]:
    return {e["label"]: e for e in event["metadataEntries"]}


@pytest.fixture
def dagster_dev(pipeline_config: PipelineConfig, tmp_path: Path):
    bootstrap = pipeline_config.bootstrap_servers
    topic = create_topic(bootstrap, "ui", partitions=1)
    key = partition_key(topic, 0)
    env, workspace = dagster_dev_env(
        pipeline_config, tmp_path, {"name": "ui", "topics": [topic]}, LOCATION,
        dagster={"lag_threshold": 1, "replica_follow_seconds": 0})
    home = Path(env["DAGSTER_HOME"])
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, [key])
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(RECORDS):
        row = {"id": i, "v": i}
        producer.produce(topic, key=orjson.dumps({"id": i}), value=orjson.dumps({
            "before": None, "after": row, "op": "c", "ts_ms": i,
            "source": {"db": "d", "table": "t", "file": "mysql-bin.000001",
                       "pos": 100 + i, "row": 0, "snapshot": "false"}}))
    assert producer.flush(30) == 0

    port = free_port()
    log = tmp_path / "dagster_dev.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("dagster")), "dev", "-w", str(workspace),
             "-h", "127.0.0.1", "-p", str(port)],
            env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        yield UI(port, proc, log), key
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.timeout(600)
def test_the_ui_tells_the_runs_story(dagster_dev) -> None:
    ui, key = dagster_dev
    source = "ui"
    ui.loaded()

    # The daemon's lag sensor requests the run, and its tags say why.
    def finished_run():
        runs = ui.runs("consume_changelog_job")
        return [r for r in runs if r["status"] in ("SUCCESS", "FAILURE")]

    (run,) = ui.wait("the sensor's consumer run", finished_run)
    assert run["status"] == "SUCCESS", ui.log.read_text()[-4000:]
    tags = {t["key"]: t["value"] for t in run["tags"]}
    assert tags["binlake/reason"] == "lag_threshold"
    assert tags["binlake/lag"] == str(RECORDS)
    assert tags["dagster/sensor_name"] == "kafka_lag_sensor"
    assert tags["dagster/partition"] == key

    # The changelog's materialization: numbers as numbers, a partition as text, tables.
    changelog = ui.asset("changelog")
    (mat,) = changelog["assetMaterializations"]
    assert (mat["partition"], mat["runId"]) == (key, run["runId"])
    md = _entries(mat)
    assert md["committed_offset"] == {"__typename": "IntMetadataEntry",
                                      "label": "committed_offset", "intValue": RECORDS}
    assert md["records"]["intValue"] == RECORDS
    assert md["partition"]["__typename"] == "TextMetadataEntry"
    assert md["consume_seconds"]["__typename"] == "FloatMetadataEntry"
    assert md["per_table"]["__typename"] == "TableMetadataEntry"
    assert md["inserts"]["intValue"] == RECORDS
    assert md["deletes"]["intValue"] == 0  # always there, so the series has no gaps
    assert md["dagster/row_count"]["intValue"] == RECORDS
    definition = _entries(changelog["definition"])
    assert definition["dagster/table_name"]["text"] == "ui.changelog"
    assert definition["dagster/uri"]["__typename"] == "PathMetadataEntry"
    columns = definition["dagster/column_schema"]["schema"]["columns"]
    assert {"name": "offset", "type": "bigint"} in columns

    # The Kafka source: one plottable number per partition, and a table of partitions.
    (obs,) = ui.asset("kafka", source)["assetObservations"]
    md = _entries(obs)
    assert md[f"committed_offset/{key}"]["intValue"] == RECORDS
    assert md[f"lag_records/{key}"] == {"__typename": "IntMetadataEntry",
                                        "label": f"lag_records/{key}", "intValue": 0}
    (row,) = [json.loads(r) for r in md["partitions"]["table"]["records"]]
    assert (row["partition"], row["committed_offset"], row["end_offset"], row["lag"]) == (
        key, RECORDS, RECORDS, 0)

    # Once caught up, the sensor's skipped ticks say why.
    def skipped():
        return [t for t in ui.ticks("kafka_lag_sensor")
                if t["status"] == "SKIPPED" and "no lag" in (t["skipReason"] or "")]

    ui.wait("a skipped lag sensor tick with its reason", skipped, timeout=60)
    assert all(t["skipReason"] for t in ui.ticks("kafka_lag_sensor")
               if t["status"] == "SKIPPED")

    # A run launched from the launchpad over a partition with nothing new: it succeeds,
    # and records an observation, not a materialization (nothing downstream starts).
    launched = ui.query(LAUNCH, params={
        "selector": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
                     "jobName": "consume_changelog_job"},
        "runConfigData": {"ops": {"changelog": {"config": {}}}},
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": key}]},
    })["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    empty_id = launched["run"]["runId"]

    def empty_done():
        return [r for r in ui.runs("consume_changelog_job")
                if r["runId"] == empty_id and r["status"] in ("SUCCESS", "FAILURE")]

    (empty,) = ui.wait("the empty run", empty_done)
    assert empty["status"] == "SUCCESS", ui.log.read_text()[-4000:]
    changelog = ui.asset("changelog")
    assert [m["runId"] for m in changelog["assetMaterializations"]] == [run["runId"]]
    (seen,) = [o for o in changelog["assetObservations"] if o["runId"] == empty_id]
    assert seen["partition"] == key and _entries(seen)["records"]["intValue"] == 0
