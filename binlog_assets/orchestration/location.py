"""What both code locations (`definitions.py`, `dbt_definitions.py`) share: the pipeline
config validated as the location loads, the `binlake` resource, and the executor of the
runs that automation and the UI make of an asset selection."""

from __future__ import annotations

from typing import Any

import dagster as dg

from binlog_assets.config import PipelineConfig, load_config
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import ONE_PROCESS


def location_config() -> PipelineConfig:
    """The pipeline config, validated at load: a bad config fails the code location with
    the field named."""
    return load_config()


def location_definitions(pipeline: PipelineConfig, *, resources: dict[str, Any] | None = None,
                         **definitions: Any) -> dg.Definitions:
    """A code location's `Definitions`, with the `binlake` resource and its executor."""
    return dg.Definitions(
        **definitions,
        resources={"binlake": BinlakeResource(), **(resources or {})},
        executor=location_executor(pipeline),
    )


def location_executor(pipeline: PipelineConfig) -> dg.ExecutorDefinition | None:
    """The executor of the runs automation and the UI make of an asset selection
    (`__ASSET_JOB`): a subprocess per step would load the code location again, 3-7 s of
    each run. With Spark in the run's process (`spark.remote` unset), a selection of
    replicas keeps a step per process: Dagster's default."""
    return ONE_PROCESS if pipeline.spark.remote else None
