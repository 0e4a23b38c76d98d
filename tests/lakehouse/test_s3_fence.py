"""The changelog on object storage: moto's S3 server (`dev/s3.py`), delta-rs over
`s3://` with conditional writes, and two runs racing for one partition.

On a local path a file lock serializes a partition's check and write; on S3 there is
none, so the fence is delta-rs's conflict check: of two commits carrying the same
transaction id (group + topic-partition), the second to land is refused, and its run
fails fenced, writing nothing.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace

import pytest
from lake_events import Partition, Source, row

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.dev.s3 import S3Server
from binlog_assets.lakehouse.changelog import (
    ChangelogWriter,
    PartitionWrite,
    changelog_uri,
)
from binlog_assets.lakehouse.delta_log import delta_rs_uri
from binlog_assets.lakehouse.fence import FencedChangelogSink, FencedRunError
from binlog_assets.lakehouse.transactions import changelog_app_id

BUCKET = "lake"
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):
    server = S3Server(tmp_path_factory.mktemp("s3"))
    server.start()
    server.create_bucket(BUCKET)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_config(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> PipelineConfig:
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    return parse_config({"lakehouse": {"path": f"s3a://{BUCKET}/binlake-{uuid.uuid4().hex[:6]}",
                                       "database": "s3fence"}})


def _sink(pipeline: PipelineConfig, writer: ChangelogWriter, part: Partition
          ) -> FencedChangelogSink:
    return FencedChangelogSink(writer, group="g", topic=part.topic,
                               partition=part.partition, expected=None,
                               lakehouse=pipeline.lakehouse.path)


def test_two_runs_racing_on_s3_end_with_one_fenced(s3_config: PipelineConfig) -> None:
    from deltalake import DeltaTable

    ChangelogWriter(s3_config).ensure_table()
    src = Source("shop.orders")
    batches = {}
    for name, n in (("A", 3), ("B", 5)):  # each run read the partition from offset 0
        part = Partition(ChangelogWriter(s3_config))
        events = part.records([[src.insert(row(i))] for i in range(1, n + 1)])
        batches[name] = (events, {e.offset: b"raw" for e in events}, part.end)
    # Both runs read the checkpoint (none yet) before either writes: the race the file
    # lock rules out on a local path.
    both_read = threading.Barrier(2)
    outcome: dict[str, str] = {}

    class RacingWriter(ChangelogWriter):
        def write(self, part: PartitionWrite) -> int | None:
            check = part.check

            def checked(current: int | None) -> None:
                check(current)
                both_read.wait(timeout=30)

            return super().write(replace(part, check=checked))

    def run(name: str) -> None:
        events, raw, end = batches[name]
        try:
            _sink(s3_config, RacingWriter(s3_config), part)(events, raw, end)
            outcome[name] = f"wrote {end}"
        except FencedRunError as e:
            outcome[name] = f"fenced: {e}"

    threads = [threading.Thread(target=run, args=(n,)) for n in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    wrote = [n for n, o in outcome.items() if o.startswith("wrote")]
    fenced = [n for n, o in outcome.items() if o.startswith("fenced")]
    assert len(wrote) == 1 and len(fenced) == 1, outcome
    assert "another run committed this partition's changelog" in outcome[fenced[0]]
    table = DeltaTable(delta_rs_uri(changelog_uri(s3_config)))
    winner_events, _, winner_end = batches[wrote[0]]
    assert table.transaction_version(
        changelog_app_id("g", part.topic, part.partition)) == winner_end
    assert len(table.to_pyarrow_table()) == len(winner_events)
