"""How many worker processes a run over several partitions uses: by its backlog.

A run decodes in one interpreter; only a backlog of at least `backlog_records` records
is worth the start of other processes (`rounds/workers.py` runs them).
The rule sits beside the lag it reads, under the run that asks it, with the config's
values already resolved into it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException

from binlog_assets.consume.lag import measure_lag

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerRule:
    """The config's rule for a run's worker processes, resolved before the run starts."""

    wanted: int | None  # `dagster.worker_processes`; None: one per core beyond the first
    limit: int | None  # records a partition's run reads at most
    backlog_records: int  # `dagster.worker_backlog_records`

    def processes(self, kafka_conf: dict, group: str,
                  partitions: Mapping[str, tuple[str, int]],
                  lags: Mapping[str, int] | None = None) -> int:
        """How many worker processes the run over `partitions` (each key's topic and
        partition) uses: none for a single partition or a backlog below
        `backlog_records` (its group's committed offsets against the partitions' ends,
        each capped at `limit`). `lags`: each key's lag as the caller has just measured
        it (a key it lacks has none), else measured here; the caller checked the
        cluster."""
        wanted = self.wanted
        if wanted is None:
            wanted = max(0, (os.cpu_count() or 1) - 1)
        wanted = min(wanted, len(partitions) - 1)
        if wanted <= 0:
            return 0
        if lags is None:
            keys = {tp: key for key, tp in partitions.items()}
            topics = sorted({t for t, _ in keys})
            try:
                measured = measure_lag(kafka_conf, group, topics, check=False)
            except KafkaException as exc:
                # The run itself can still go on, in its own process.
                log.warning("no worker processes: the backlog of %s is unknown: %s",
                            topics, exc)
                return 0
            lags = {keys[pl.topic, pl.partition]: pl.lag for pl in measured
                    if (pl.topic, pl.partition) in keys}
        backlog = sum(lag if self.limit is None else min(lag, self.limit)
                      for lag in (lags.get(k, 0) for k in partitions))
        return wanted if backlog >= self.backlog_records else 0
