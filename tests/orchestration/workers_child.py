"""`python workers_child.py CONFIG_PATH KEY...`: one run over KEYs as the changelog asset
runs it (handlers from the config, worker processes as the config allows); prints one
`WORKERS-RESULT <json>` line per partition. The worker drill SIGKILLs it mid-run."""

from __future__ import annotations

import json
import sys


def main() -> None:
    from binlog_assets.config import load_config
    from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
    from binlog_assets.rounds.round import RoundOptions, consume_partitions

    pipeline = load_config(sys.argv[1])
    outcomes = consume_partitions(pipeline, dict(pipeline.kafka), sys.argv[2:],
                                  ChangelogRunConfig(), group=pipeline.kafka["group.id"],
                                  options=RoundOptions(parallel=1))
    for o in outcomes:
        print("WORKERS-RESULT " + json.dumps({
            "key": o.key, "error": None if o.error is None else repr(o.error),
            "committed": None if o.summary is None else o.summary.committed_offset,
            "sink": None if o.sink is None else type(o.sink).__name__}), flush=True)


if __name__ == "__main__":
    main()
