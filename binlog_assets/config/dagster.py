"""`dagster:`: runs, sensors, followers and checks of the code location."""

from __future__ import annotations

import re

from pydantic import (
    Field,
    field_validator,
)

from binlog_assets.config.base import ConfigModel
from binlog_assets.consume import defaults

_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
_TEAM = re.compile(r"team:[A-Za-z0-9_-]+")


class DagsterConfig(ConfigModel):
    lag_threshold: int = Field(1, ge=0, description="records of lag that trigger a run")
    max_staleness_seconds: int = Field(
        300, ge=0, description="request a run for any lag older than this")
    max_lag_records: int = Field(10_000, ge=0, description="the lag check fails above this")
    max_records_per_run: int | None = Field(
        None, ge=1, description="cap on records per bounded run; unset: none")
    max_seconds_per_run: float | None = Field(
        None, gt=0, description="cap on seconds per bounded run; unset: none")
    commit_timeout_seconds: float = Field(
        defaults.COMMIT_TIMEOUT_SECONDS, gt=0, le=3600,
        description="a Kafka offset commit with no answer within this fails the run")
    max_partitions_per_run: int = Field(
        50, ge=1, le=10_000,
        description="topic-partitions one consumer run serves at most (lag sensor batches, "
                    "backfill runs)")
    worker_processes: int | None = Field(
        None, ge=0, le=64,
        description="processes besides its own that a consumer run hands partitions to "
                    "when its backlog is large (unset: one per CPU core beyond the first; "
                    "0: none)")
    worker_backlog_records: int = Field(
        200_000, ge=1,
        description="records to read across a run's partitions from which it uses "
                    "worker processes")
    changelog_follow_seconds: float = Field(
        0, ge=0, le=86_400,
        description="0: `kafka_lag_sensor` launches bounded consumer runs where lag builds "
                    "up; above 0, a changelog follower run (`follow_changelog_job`, kept "
                    "going by `changelog_follower_sensor`) consumes each partition's new "
                    "records as they arrive, for this many seconds per run")
    changelog_poll_seconds: float = Field(
        0.5, gt=0, le=60, description="how often an idle changelog follower run measures "
                                      "the partitions' lag")
    replica_follow_seconds: float = Field(
        0, ge=0, le=86_400,
        description="0: automation builds the replicas after each consumer run; above 0, a "
                    "follower run (`follow_replicas_job`, kept going by "
                    "`replica_follower_sensor`) applies each new changelog version as it "
                    "lands, for this many seconds per run")
    replica_poll_seconds: float = Field(
        0.5, gt=0, le=60, description="how often a follower run looks for a new changelog "
                                      "version (a read of the changelog's log)")
    replica_delay_alert_seconds: float = Field(
        900.0, gt=0,
        description="a replica's `source_delay` check warns when the newest change an apply "
                    "wrote reached the replica more than this many seconds after its "
                    "source commit")
    dbt_follow_seconds: float = Field(
        300.0, ge=0, le=86_400,
        description="`dbt_follow_sensor` builds the dbt models downstream of the replicas "
                    "that changed as soon as one changes, and at most once per this many "
                    "seconds (0: after every change, one build at a time)")
    owners: list[str] = Field(
        default_factory=list,
        description="owners of binlake's assets in the UI: emails or `team:<name>`")

    @field_validator("owners")
    @classmethod
    def _owners_are_emails_or_teams(cls, owners: list[str]) -> list[str]:
        # Dagster's own rule, checked here so a bad owner fails at load naming the field.
        for owner in owners:
            if not (_EMAIL.fullmatch(owner) or _TEAM.fullmatch(owner)):
                raise ValueError(f"{owner!r} is neither an email nor 'team:<name>'")
        return owners


