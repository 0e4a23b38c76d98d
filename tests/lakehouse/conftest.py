"""Fixtures for the lakehouse tests: a fresh pipeline config (own database) per test.

Every config shares the session's lakehouse path, so the one Spark session and its
catalog serve them all; a database of its own keeps each test's changelog and replicas
apart from the others'.
"""

from __future__ import annotations

from typing import Any

import pytest
from lake_events import ALWAYS_MERGE, ALWAYS_REWRITE, MakeConfig, config_for

from binlog_assets.config import PipelineConfig


@pytest.fixture
def make_config(pipeline_config: PipelineConfig) -> MakeConfig:
    """Configs with the product's defaults, a database of their own each."""

    def make(tables: list[dict[str, Any]], **kwargs: Any) -> PipelineConfig:
        return config_for(pipeline_config, tables, **kwargs)

    return make


# The rewrite variants run with `make test-long`: the default suite still applies by
# rewrite in the replica model test, which draws MERGE or rewrite for every batch.
@pytest.fixture(params=["merge", pytest.param("rewrite", marks=pytest.mark.long)])
def make_config_each_path(make_config: MakeConfig, request: pytest.FixtureRequest
                          ) -> MakeConfig:
    """Configs whose replicas apply every batch into existing rows by MERGE, or (the
    second run of each test) by the one-pass rewrite: both must give the same replicas."""
    ratio = ALWAYS_MERGE if request.param == "merge" else ALWAYS_REWRITE
    return lambda tables, **kwargs: make_config(tables, **{"rewrite_ratio": ratio, **kwargs})
