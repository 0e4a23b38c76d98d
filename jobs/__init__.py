"""Asset jobs and schedules users launch from the Dagster UI."""

from __future__ import annotations

import dagster as dg

smoke_job = dg.define_asset_job(
    name="smoke_job",
    selection=dg.AssetSelection.groups("smoke"),
    description="Smoke run of the local stack: Kafka change events into a Delta table.",
)
