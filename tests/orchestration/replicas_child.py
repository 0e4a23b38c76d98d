"""One Dagster run of `build_replicas_job` in a process of its own (`python
replicas_child.py`, config from `BINLAKE_CONFIG`, instance from `DAGSTER_HOME`), printing
one `REPLICAS-RESULT <json>` line: the run's id and success."""

from __future__ import annotations

import json


def main() -> None:
    import dagster as dg

    from binlog_assets.definitions import defs

    with dg.DagsterInstance.get() as instance:
        result = defs.resolve_job_def("build_replicas_job").execute_in_process(
            instance=instance, raise_on_error=False)
        print("REPLICAS-RESULT " + json.dumps({"success": result.success,
                                               "run_id": result.run_id}), flush=True)


if __name__ == "__main__":
    main()
