"""The launchpad's config of a consumer run (replay and limits): the Dagster face of
`rounds.partition.RunLimits`."""

from __future__ import annotations

import dagster as dg
from pydantic import Field


class ChangelogRunConfig(dg.Config):
    """Replay and limits of one bounded consumer run, set in the launchpad. A replay reads
    the partition again from the given point: the handlers see those events again, and
    the changelog stays exactly once (rows it already holds are not appended again)."""

    start_offset: int | None = Field(
        None, description="Replay from this Kafka offset. Overrides every checkpoint "
                          "source, and wins over start_timestamp_ms when both are set.")
    start_timestamp_ms: int | None = Field(
        None, description="Replay from the first offset at or after this time (ms since "
                          "the epoch, the broker's record timestamps). Ignored when "
                          "start_offset is set.")
    max_records: int | None = Field(
        None, description="Stop after this many records (default: "
                          "dagster.max_records_per_run; the next run goes on from there).")
    max_seconds: float | None = Field(
        None, description="Stop after this many seconds (default: "
                          "dagster.max_seconds_per_run).")


# What the launchpad opens on: the replay fields, in this order, and no infrastructure
# settings (the binlake resource reads its config file from BINLAKE_CONFIG).
CHANGELOG_RUN_CONFIG_SCAFFOLD = {
    "ops": {"changelog": {"config": dict.fromkeys(ChangelogRunConfig.model_fields)}}}


