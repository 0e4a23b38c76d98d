"""The dev PostgreSQL server as a Dagster instance's storage: a consumer run's
materializations and the checkpoint read back from them live in PostgreSQL, and survive
a restart of the server."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from run_inputs import produce_inserts, run_config_file

from binlog_assets.config import PipelineConfig
from binlog_assets.dev.kafka import create_topic
from binlog_assets.dev.postgres import DAGSTER_PG_URL_ENV, PostgresServer, postgres_instance_yaml
from binlog_assets.orchestration.changelog_asset import changelog
from binlog_assets.orchestration.metadata_checkpoint import latest_metadata_checkpoint
from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME, partition_key
from binlog_assets.orchestration.resources import BinlakeResource

pytestmark = pytest.mark.integration


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    # Not under pytest's tmp_path: its folders are private to this user, and as root the
    # server runs as `postgres`, which must reach its directory.
    work = Path(tempfile.mkdtemp(prefix="binlake-pg-"))
    work.chmod(0o755)
    server = PostgresServer(work / "pg")
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def test_an_instance_on_postgres_keeps_a_runs_materializations(
        postgres: PostgresServer, pipeline_config: PipelineConfig, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

    bootstrap = pipeline_config.bootstrap_servers
    topic = create_topic(bootstrap, "pg", partitions=1)
    produce_inserts(bootstrap, topic, {0: 4})
    config_path = run_config_file(pipeline_config, tmp_path, {"name": "pg", "topics": [topic]})
    key = partition_key(topic, 0)
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text(postgres_instance_yaml())
    monkeypatch.setenv(DAGSTER_PG_URL_ENV, postgres.url)

    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, [key])
        result = dg.materialize(
            [changelog], instance=instance, partition_key=key,
            resources={"binlake": BinlakeResource(config_path=str(config_path))})
        assert result.success
    postgres.stop()
    assert postgres.running_pid() is None
    postgres.start()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        checkpoint = latest_metadata_checkpoint(instance, key)
        assert checkpoint is not None and checkpoint.offset == 4
        runs = instance.get_runs()
        assert [r.status for r in runs] == [dg.DagsterRunStatus.SUCCESS]
    # The rows are in PostgreSQL itself, not in a file beside the instance.
    with postgres.connect(postgres.database) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM runs")
        assert cur.fetchone()[0] == 1
    assert not [p for p in os.listdir(home) if p.endswith(".db")]
