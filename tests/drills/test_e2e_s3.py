"""The lakehouse on object storage: the seeded MariaDB workload with `lakehouse.path` at
`s3a://` on the local stack's S3-compatible server (moto, `dev/s3.py`).

Debezium publishes the workload; bounded consumer runs write the changelog to `s3://`
with delta-rs (conditional writes, credentials from the environment); a child process
builds the replicas with Spark over `s3a://` (hadoop-aws from `.cache/jars/s3`) and
compares each with its source. The figures go to the drill report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from drill_lib import seeded_build, shop_config

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.dev import drills
from binlog_assets.dev.connect import DebeziumFence, KafkaConnect
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.dev.s3 import S3Server
from binlog_assets.lakehouse.changelog import changelog_uri

pytestmark = pytest.mark.long
SEED = 20261125
STATEMENTS = 300
BUCKET = "lake"


def _s3_config(base: PipelineConfig, catalog: Path) -> PipelineConfig:
    data = shop_config(base, "e2e_s3").model_dump(mode="json", exclude_none=True)
    data["lakehouse"] = {**data["lakehouse"], "path": f"s3a://{BUCKET}/binlake"}
    # The catalog stays an embedded Derby, in the test's directory (a lakehouse on S3
    # would have a real metastore: README, Beyond one machine).
    data["spark"] = {**data.get("spark", {}), "conf": {
        "spark.hadoop.javax.jdo.option.ConnectionURL":
            f"jdbc:derby:;databaseName={catalog};create=true"}}
    return parse_config(data)


def test_seeded_workload_with_the_lakehouse_on_s3(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, debezium_fence: DebeziumFence,
    pipeline_config: PipelineConfig,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    s3 = S3Server(tmp_path / "s3")
    s3.start()
    try:
        s3.create_bucket(BUCKET)
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)  # this process's delta-rs, and the child's Spark
        pipeline = _s3_config(pipeline_config, tmp_path / "metastore_db")
        statements, summaries, consume_seconds, result = seeded_build(
            pipeline, mariadb, debezium_fence, SEED, STATEMENTS, tmp_path)
        import boto3

        objects = boto3.client("s3", endpoint_url=s3.endpoint,
                               aws_access_key_id=s3.access_key,
                               aws_secret_access_key=s3.secret_key,
                               region_name=s3.region).list_objects_v2(
            Bucket=BUCKET, Prefix="binlake/")["KeyCount"]
    finally:
        s3.stop()

    compared = result["compared"]
    figures = {
        "seed": SEED, "statements": statements,
        "debezium_events": sum(s.events for s in summaries),
        "consume_seconds": round(consume_seconds, 1),
        "session_seconds": result["session_seconds"],
        "replica_build_seconds": result["build_seconds"],
        "rows_compared": sum(s + r for s, r, _ in compared.values()),
        "mismatches": sum(m + abs(s - r) for s, r, m in compared.values()),
        "objects_in_bucket": objects,
    }
    drills.record("e2e_s3", figures)
    print(f"\ns3 e2e: {json.dumps(figures)}")
    assert changelog_uri(pipeline).startswith(f"s3a://{BUCKET}/")
    assert result["replica_location"].startswith(f"s3a://{BUCKET}/"), result
    for replica, (source_rows, replica_rows, mismatched) in compared.items():
        assert source_rows > 0 and source_rows == replica_rows and mismatched == 0, \
            (replica, compared)
