"""One Dagster run of the consume job, in a process of its own, reporting what it started.

`python consume_child.py FIRST_KEY LAST_KEY` loads the code location as a run worker does
(`binlog_assets.definitions`, config from `BINLAKE_CONFIG`, instance from
`DAGSTER_HOME`), runs `consume_changelog_job` over the partition range FIRST..LAST and
prints one `CONSUME-RESULT <json>` line: the run's success, whether pyspark or py4j was
imported, and every child process it launched.
"""

from __future__ import annotations

import json
import subprocess
import sys

_launched: list[list[str]] = []
_popen_init = subprocess.Popen.__init__


def _recording_init(self, args, *rest, **kwargs) -> None:
    _launched.append([str(a) for a in args] if isinstance(args, list | tuple) else [str(args)])
    _popen_init(self, args, *rest, **kwargs)


def main() -> None:
    first, last = sys.argv[1], sys.argv[2]
    subprocess.Popen.__init__ = _recording_init
    import dagster as dg

    from binlog_assets.definitions import defs
    from binlog_assets.orchestration.shared import (
        CONSUME_JOB_NAME,
        RANGE_END_TAG,
        RANGE_START_TAG,
    )

    with dg.DagsterInstance.get() as instance:
        result = defs.resolve_job_def(CONSUME_JOB_NAME).execute_in_process(
            instance=instance, tags={RANGE_START_TAG: first, RANGE_END_TAG: last},
            raise_on_error=False)
        print("CONSUME-RESULT " + json.dumps({
            "success": result.success,
            "run_id": result.run_id,
            "pyspark": sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j")),
            "launched": _launched,
        }), flush=True)


if __name__ == "__main__":
    main()
