"""A round's report: its partitions' outcomes, and where the round left its sources'
partitions (their lags, the changelog's row count), measured by the round's gauge, so
that whoever reports the round to Dagster measures nothing itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from binlog_assets.consume.lag import PartitionLag, measure_lag
from binlog_assets.lakehouse.delta_log import file_rows, open_log
from binlog_assets.rounds.partition import PartitionOutcome
from binlog_assets.rounds.plan import RunReport


class Gauge(Protocol):
    """How a round's report measures where the round left things."""

    def lags(self, run: RunReport) -> Sequence[PartitionLag]:
        """At least the lags of the round's sources' topics."""

    def rows(self, run: RunReport, outcomes: Sequence[PartitionOutcome]) -> int | None:
        """The changelog's row count after the round (None: unknown)."""


class FreshGauge:
    """Each measurement by itself: the lags through a consumer of their own, the row
    count from the changelog's Delta log (every file's statistics)."""

    def lags(self, run: RunReport) -> Sequence[PartitionLag]:
        # Every source's topics in one request; the run checked the cluster when it
        # started: one round trip less.
        return measure_lag(run.kafka_conf, run.group, run.topics, check=False)

    def rows(self, run: RunReport, outcomes: Sequence[PartitionOutcome]) -> int | None:
        return file_rows(open_log(run.changelog_uri))


@dataclass(frozen=True)
class RoundReport:
    """A round's partitions' outcomes, in the order of its keys, and where the round left
    things, measured by its gauge when first asked: a caller that reports nothing
    measures nothing. `cluster_wait_seconds`: how long the round's cluster check waited
    for Kafka to answer."""

    run: RunReport
    outcomes: list[PartitionOutcome]
    gauge: Gauge
    cluster_wait_seconds: float = 0.0

    @property
    def consumed(self) -> bool:
        """Whether any partition read a record."""
        return any(o.summary.records for o in self.outcomes if o.summary is not None)

    @property
    def failed(self) -> list[PartitionOutcome]:
        return [o for o in self.outcomes if o.error is not None]

    @cached_property
    def lags(self) -> Sequence[PartitionLag]:
        """At least the lags of the round's sources' topics, after the round."""
        return self.gauge.lags(self.run)

    @cached_property
    def rows(self) -> int | None:
        """The changelog's row count after the round; None when the round read no
        record (nothing to count anew) or it is unknown."""
        return self.gauge.rows(self.run, self.outcomes) if self.consumed else None
