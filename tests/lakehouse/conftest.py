"""Fixtures for the lakehouse tests: a fresh pipeline config (own database) per test.

Every config shares the session's lakehouse path, so the one Spark session and its
catalog serve them all; a database of its own keeps each test's changelog and replicas
apart from the others'.
"""

from __future__ import annotations

from typing import Any

import pytest
from lake_events import APPLY_PATHS, MakeConfig, config_for

from binlog_assets.config import PipelineConfig


@pytest.fixture
def make_config(pipeline_config: PipelineConfig) -> MakeConfig:
    """Configs with the product's defaults, a database of their own each."""

    def make(tables: list[dict[str, Any]], **kwargs: Any) -> PipelineConfig:
        return config_for(pipeline_config, tables, **kwargs)

    return make


# The Spark MERGE and rewrite variants run with `make test-long`: the default suite still
# applies by both in the replica model test, which draws a path for every batch, and by
# Spark's MERGE wherever a batch holds a truncate.
@pytest.fixture(params=["driver", pytest.param("spark_merge", marks=pytest.mark.long),
                        pytest.param("rewrite", marks=pytest.mark.long)])
def make_config_each_path(make_config: MakeConfig, request: pytest.FixtureRequest
                          ) -> MakeConfig:
    """Configs whose replicas apply every batch into existing rows by delta-rs's MERGE
    from the driver, or (the long variants) by Spark's MERGE or by the one-pass rewrite:
    each must give the same replicas."""
    settings = APPLY_PATHS[request.param]
    return lambda tables, **kwargs: make_config(tables, **{**settings, **kwargs})
