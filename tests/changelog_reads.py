"""Test helpers that read the changelog whole: what a test checks after a run, which the
product itself never needs (it reads version ranges, `changelog_reader.read_changelog`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from binlog_assets.identifiers import qualified
from binlog_assets.lakehouse.changelog import ChangelogWriter, changelog_name, changelog_uri
from binlog_assets.lakehouse.changelog_reader import register_changelog

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from binlog_assets.config import PipelineConfig


def changelog_frame(spark: SparkSession, pipeline: PipelineConfig) -> DataFrame:
    """The whole changelog table, as of now (registered in the catalog first)."""
    if not register_changelog(spark, pipeline):
        raise FileNotFoundError(f"no changelog table at {changelog_uri(pipeline)} yet: "
                                f"no consumer run has written one")
    return spark.table(qualified(*changelog_name(pipeline)))


def changelog_checkpoint(pipeline: PipelineConfig, group_id: str, topic: str,
                         partition: int) -> int | None:
    """Where `topic`[`partition`] resumes per the changelog: the end offset last written."""
    return ChangelogWriter(pipeline).checkpoint(group_id, topic, partition)
