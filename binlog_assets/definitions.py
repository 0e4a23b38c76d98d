"""The one place that builds binlake's `dg.Definitions` (loaded via workspace.yaml)."""

from __future__ import annotations

import dagster as dg

from binlog_assets.config import load_config
from binlog_assets.orchestration.assets import smoke_changelog
from binlog_assets.orchestration.resources import BinlakeResource, spark_resource
from jobs import smoke_job

# Validated at load: a bad config fails the code location with the field named.
PIPELINE_CONFIG = load_config()

defs = dg.Definitions(
    assets=[smoke_changelog],
    jobs=[smoke_job],
    resources={
        "binlake": BinlakeResource(),
        "pyspark": spark_resource(PIPELINE_CONFIG),
    },
)
