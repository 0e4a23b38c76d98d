"""Fixtures for the lakehouse tests: a fresh pipeline config (own database) per test.

Every config shares the session's lakehouse path, so the one Spark session and its
catalog serve them all; a database of its own keeps each test's changelog and replicas
apart from the others'.
"""

from __future__ import annotations

from typing import Any

import pytest
from lake_events import MakeConfig, config_for

from binlog_assets.config import PipelineConfig


@pytest.fixture
def make_config(pipeline_config: PipelineConfig) -> MakeConfig:
    def make(tables: list[dict[str, Any]], **kwargs: Any) -> PipelineConfig:
        return config_for(pipeline_config, tables, **kwargs)

    return make
