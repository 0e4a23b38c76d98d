"""Commit surveys read once per process: every replica of a cycle surveys the same
versions, and reading each commit's metadata again per replica grew with the tables."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from lake_events import Partition, Source, row

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.lakehouse import changelog_reader
from binlog_assets.lakehouse.changelog import (
    ChangelogWriter,
    changelog_uri,
)
from binlog_assets.lakehouse.changelog_reader import read_survey
from binlog_assets.lakehouse.delta_log import delta_rs_uri


def _config(lake: Path) -> PipelineConfig:
    return parse_config({
        "kafka": {"bootstrap.servers": "127.0.0.1:9", "group.id": "g"},
        "lakehouse": {"path": str(lake), "database": "surveys"},
        "sources": [{"name": "shop", "topics": ["binlog"], "format": "debezium",
                     "tables": [{"source": "shop.orders", "replica": "orders"},
                                {"source": "shop.items", "replica": "items"}]}],
    })


@pytest.fixture
def history_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The `limit` of every changelog history read, from a cache emptied first."""
    monkeypatch.setattr(changelog_reader, "_commits", {}, raising=False)
    monkeypatch.setattr(changelog_reader, "_merged", {}, raising=False)
    reads: list[int] = []
    real = DeltaTable.history

    def counted(self: DeltaTable, limit: int | None = None) -> list[dict]:
        reads.append(limit)
        return real(self, limit)

    monkeypatch.setattr(DeltaTable, "history", counted)
    return reads


def _write(part: Partition, tables: list[str], ident: int) -> int:
    version = part.write(part.records([[Source(t).insert(row(ident))] for t in tables]))
    assert version is not None
    return version


def test_each_commit_is_read_once_and_later_ones_alone(tmp_path: Path,
                                                       history_reads: list[int]) -> None:
    pipeline = _config(tmp_path)
    part = Partition(ChangelogWriter(pipeline))
    first = _write(part, ["shop.orders"], 1)
    second = _write(part, ["shop.orders", "shop.items"], 2)

    got = read_survey(None, pipeline, first - 1, second)
    assert got is not None and {g.table for g in got} == {"shop.orders", "shop.items"}
    assert history_reads == [second - first + 1]
    # A second replica of the same cycle: nothing read again, the same survey.
    assert read_survey(None, pipeline, first - 1, second) == got
    assert history_reads == [second - first + 1]

    third = _write(part, ["shop.items"], 3)
    # The next cycle's survey reads only what was committed since, and says the same as
    # a process that never read the changelog before.
    later = read_survey(None, pipeline, second, third)
    assert history_reads == [second - first + 1, 1]
    changelog_reader._commits.clear()
    changelog_reader._merged.clear()
    assert read_survey(None, pipeline, second, third) == later
    assert read_survey(None, pipeline, first - 1, third) is not None
    assert history_reads[-1] == third - first + 1


def test_a_changelog_made_again_at_its_location_is_read_anew(tmp_path: Path,
                                                             history_reads: list[int]
                                                             ) -> None:
    pipeline = _config(tmp_path)
    first = _write(Partition(ChangelogWriter(pipeline)), ["shop.orders"], 1)
    before = read_survey(None, pipeline, first - 1, first)
    assert before is not None and {g.table for g in before} == {"shop.orders"}

    location = Path(delta_rs_uri(changelog_uri(pipeline)))
    for path in sorted(location.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    again = _write(Partition(ChangelogWriter(pipeline)), ["shop.items"], 1)
    assert again == first  # the same version numbers, another table
    after = read_survey(None, pipeline, again - 1, again)
    assert after is not None and {g.table for g in after} == {"shop.items"}
