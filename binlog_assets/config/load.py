"""The initial load's settings (`load`): how hard a table's load may press on its source
(README: Initial load). The load reads over the source's read-only connection
(`sources[].connection`), as the parity check does."""

from __future__ import annotations

from pydantic import Field

from binlog_assets.config.base import ConfigModel


class LoadConfig(ConfigModel):
    """Chunks of `chunk_rows` keys, read by `workers` processes at once, each chunk in its
    own short consistent snapshot: no table lock, no long transaction."""

    workers: int = Field(2, ge=1, le=64,
                         description="chunks read at once, each by its own process and "
                                     "source connection")
    chunk_rows: int = Field(50_000, ge=1, le=10_000_000,
                            description="keys per chunk: one snapshot, one range query, one "
                                        "changelog commit")
    pause_seconds: float = Field(0.0, ge=0, le=60,
                                 description="a pause each worker takes between two chunks")
    new_replicas: bool = Field(
        False, description="`initial_load_sensor` launches `load_replica_job` for each "
                           "replica new to binlake.yaml, and for each replica never built, "
                           "whose source has a `connection`")
