"""One consumer pass of the SIGKILL drill, in a process of its own (the drill kills it).

`python drill_child.py CONFIG_PATH KEY[,KEY...] REPLICA[,REPLICA...]` materializes the
changelog asset for each partition key through Dagster (`dg.materialize` against the
instance in `DAGSTER_HOME`, the asset's own code path: its checkpoint precedence, its
fencing, its metadata), then builds the replicas with `ReplicaBuilder`, as the replica
asset does. `BINLAKE_FAULT` (binlog_assets/faults.py) picks where it dies; the
`after_metadata_write` boundary is here, after each materialization is recorded. On a
clean finish it prints one `DRILL-RESULT <json>` line.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    config_path, keys = sys.argv[1], sys.argv[2].split(",")
    replicas = [r for r in sys.argv[3].split(",") if r]
    import dagster as dg

    from binlog_assets.config import load_config
    from binlog_assets.faults import fault_point
    from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
    from binlog_assets.lakehouse.spark import get_spark
    from binlog_assets.orchestration.changelog_asset import changelog
    from binlog_assets.orchestration.partitions import KAFKA_PARTITIONS_NAME
    from binlog_assets.orchestration.resources import BinlakeResource

    began = time.monotonic()
    pipeline = load_config(config_path)
    out: dict = {"runs": {}, "replicas": {}}
    with dg.DagsterInstance.get() as instance:
        known = set(instance.get_dynamic_partitions(KAFKA_PARTITIONS_NAME))
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, [k for k in keys if k not in known])
        resources = {
            "binlake": BinlakeResource(config_path=config_path),
        }
        for key in keys:
            result = dg.materialize([changelog], partition_key=key, instance=instance,
                                    resources=resources)
            # A run that read nothing records an observation instead of a materialization.
            (event,) = (result.asset_materializations_for_node("changelog")
                        or [o for o in result.asset_observations_for_node("changelog")
                            if o.asset_key == changelog.key])
            md = event.metadata
            out["runs"][key] = {name: md[name].value for name in
                                ("start_offset", "checkpoint_source", "committed_offset",
                                 "records", "events", "dead_lettered") if name in md}
            fault_point("after_metadata_write")
    # A child that builds no replica starts no Spark JVM: most of a child's time.
    builder = ReplicaBuilder(get_spark(pipeline), pipeline) if replicas else None
    for name in replicas:
        r = builder.apply(name)
        out["replicas"][name] = {"applied_version": r.applied_version, "rows": r.rows,
                                 "written": r.written}
    out["seconds"] = round(time.monotonic() - began, 1)
    print("DRILL-RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
