"""The code location `bench_run_cost.py` runs: binlake's own definitions plus one no-op
asset and its job, so both runs of the comparison load exactly the same code. The no-op
job runs in process, as the consume job does (the default executor's step subprocess
would load the code location a second time and make the consume run look cheap)."""

import dagster as dg

from binlog_assets.definitions import defs as binlake_defs


@dg.asset
def noop() -> None:
    """Does nothing: the fixed cost of a Dagster run in this code location."""


defs = dg.Definitions.merge(
    binlake_defs,
    dg.Definitions(assets=[noop], jobs=[dg.define_asset_job(
        "noop_job", selection=[noop], executor_def=dg.in_process_executor)]),
)
