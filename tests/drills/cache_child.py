"""`python cache_child.py CONFIG_PATH KEY`: one bounded consumer run of KEY with the
handlers its config names, as the changelog asset runs it; prints its summary. The drill
starts it with a fault point (`BINLAKE_FAULT`) to SIGKILL it mid-run."""

from __future__ import annotations

import dataclasses
import json
import sys


def main() -> None:
    from binlog_assets.config import load_config
    from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
    from binlog_assets.rounds.round import consume_partitions

    pipeline = load_config(sys.argv[1])
    [outcome] = consume_partitions(pipeline, dict(pipeline.kafka), [sys.argv[2]],
                                   ChangelogRunConfig(), group=pipeline.kafka["group.id"])
    if outcome.error is not None:
        raise outcome.error
    s = outcome.summary
    from binlog_assets.examples.customer_cache import customers

    print("CACHE-RESULT " + json.dumps({
        "cache_changes": customers.applied,
        "events": s.events, "committed": s.committed_offset, "seconds": s.seconds,
        "dead_lettered": s.dead_lettered,
        "handlers": {n: dataclasses.asdict(m) for n, m in s.handlers.items()}}), flush=True)


if __name__ == "__main__":
    main()
