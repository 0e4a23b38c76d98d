"""`load_replica_job`: a replica's initial load from the launchpad (README: Initial load),
while streaming goes on. Four ops, so a run re-executed from its failure resumes where
it stopped:

- `plan_load` walks each source table's primary key on the source's read-only
  connection into chunks; its output (the plans) is kept by the run's IO manager;
- `prepare_load` (in the `spark` pool) makes the replica ready for a load appended
  straight to it where the replica takes one (`load/direct.py`): made of the first
  chunk where it does not exist yet, then held by the load until `apply_loaded`;
- `load_chunks` reads the chunks in parallel (`load.workers`), each in its own consistent
  snapshot, into the changelog (`binlog_assets/load`) and, prepared so, the replica;
  every chunk is committed once, whatever attempt commits it, and the replica's asset
  gets an observation per step of progress (rows, chunks, rows/s, time to go: the UI
  plots them);
- `apply_loaded` applies the replica as a replica run would, in the `spark` pool, and
  reports it with its row-count check.
"""

import json
import time
from collections.abc import Iterator

import dagster as dg
from pydantic import Field

from binlog_assets.config import PipelineConfig
from binlog_assets.orchestration.replica_reports import applied_events, replica_key
from binlog_assets.orchestration.resources import BinlakeResource
from binlog_assets.orchestration.shared import SPARK_POOL

LOAD_JOB_NAME = "load_replica_job"
# At most one progress observation per this many seconds (and one at the end).
PROGRESS_SECONDS = 10.0


class LoadJobConfig(dg.Config):
    replica: str = Field(description="the replica to load (as in `replica/<name>`)")
    table: str = Field("", description="one source table `db.table` (empty: every source "
                                       "table of the replica)")


@dg.op(name="plan_load", out=dg.Out(dict),
       description="Walk each source table's primary key into the load's chunks.")
def plan_load(context: dg.OpExecutionContext, config: LoadJobConfig,
              binlake: BinlakeResource) -> dict:
    from binlog_assets.load.tables import new_plan
    from binlog_assets.parity.check import replica_sources

    pipeline = binlake.pipeline
    plans = []
    for source, db, table in replica_sources(pipeline, config.replica, config.table):
        plan = new_plan(pipeline, db, table)
        context.log.info(f"{table.name}: load {plan.load_id}, {len(plan.uppers)} chunks of "
                         f"up to {pipeline.load.chunk_rows:,} keys, {plan.workers} workers")
        plans.append({"source": source.name, "plan": plan.to_json()})
    if not plans:
        raise ValueError(f"no source table {config.table!r} of replica {config.replica!r}")
    return {"replica": config.replica, "plans": plans}


@dg.op(name="prepare_load", out=dg.Out(dict), pool=SPARK_POOL,
       description="Make the replica ready for a load written straight into it, where it "
                   "takes one (one table keyed by its primary key, no replica or a small "
                   "one yet).")
def prepare_load(context: dg.OpExecutionContext, planned: dict,
                 binlake: BinlakeResource) -> dict:
    from dataclasses import asdict
    from functools import partial

    from binlog_assets.load.direct import prepare_direct
    from binlog_assets.load.plan import LoadPlan
    from binlog_assets.load.tables import load_first_chunk
    from binlog_assets.parity.check import replica_sources
    from binlog_assets.parity.lineage import lineage_placer

    pipeline, replica = binlake.pipeline, planned["replica"]
    direct, first = None, []
    if len(planned["plans"]) == 1:
        [entry] = planned["plans"]
        plan = LoadPlan.from_json(entry["plan"])
        for source, db, table in replica_sources(pipeline, replica, plan.table):
            placer = lineage_placer(pipeline, source, db, binlake.kafka_conf(),
                                    pipeline.kafka["group.id"])
            chunk = partial(load_first_chunk, pipeline, source, db, table, plan,
                            lineage=placer)
            target = prepare_direct(binlake.spark(), pipeline, replica, plan.load_id,
                                    lambda chunk=chunk: first.append(chunk()))
            direct = None if target is None else asdict(target)
    context.log.info(f"replica {replica}: " + (
        "the load goes through the changelog" if direct is None else
        f"the load is appended to it from chunk {direct['first']} (its changelog rows "
        f"under {direct['topic']})"))
    # The first chunk's rows count in the load's, though they came in here.
    return {**planned, "direct": direct, "first_rows": sum(c.rows for c in first)}


@dg.op(name="load_chunks", out=dg.Out(dict),
       description="Read the planned chunks in parallel into the changelog (and the "
                   "replica, where the load goes straight into it).")
def load_chunks(context: dg.OpExecutionContext, planned: dict,
                binlake: BinlakeResource) -> dict:
    from binlog_assets.load.direct import DirectTarget
    from binlog_assets.load.plan import LoadPlan
    from binlog_assets.load.tables import load_table
    from binlog_assets.parity.check import replica_sources
    from binlog_assets.parity.lineage import lineage_placer

    pipeline, replica = binlake.pipeline, planned["replica"]
    plans = {(e["source"], (p := LoadPlan.from_json(e["plan"])).table): p
             for e in planned["plans"]}
    direct = planned.get("direct")
    target = None if direct is None else DirectTarget(**direct)
    loads = []
    for source, db, table in replica_sources(pipeline, replica):
        plan = plans.pop((source.name, table.name), None)
        if plan is None:
            continue  # not planned (one table of the replica asked for)
        placer = lineage_placer(pipeline, source, db, binlake.kafka_conf(),
                                pipeline.kafka["group.id"])
        done = load_table(pipeline, source, db, table, plan, lineage=placer,
                          progress=_progress(context, replica, table.name), direct=target)
        context.log.info(f"{done.table}: {done.rows:,} rows in {done.chunks} chunks "
                         f"({done.resumed_chunks} committed by an earlier attempt), "
                         f"{done.rows_per_second:,.0f} rows/s, lineage {done.lineage}")
        loads.append({"table": done.table, "load_id": done.load_id,
                      "rows": done.rows + planned.get("first_rows", 0),
                      "chunks": done.chunks, "resumed_chunks": done.resumed_chunks,
                      "seconds": round(done.seconds, 1)})
    if plans:
        raise ValueError(f"planned tables the source no longer has: {sorted(plans)}")
    return {"replica": replica, "loads": loads, "direct": direct}


def _progress(context: dg.OpExecutionContext, replica: str, table: str):  # noqa: ANN202
    shown = [0.0]

    def progress(state, chunk) -> None:  # noqa: ANN001
        if chunk.version is None:
            return  # committed by an earlier attempt
        context.log.info(f"{table}: {state.describe()}")
        if time.monotonic() - shown[0] < PROGRESS_SECONDS and \
                state.chunks_done < state.chunks:
            return
        shown[0] = time.monotonic()
        context.log_event(dg.AssetObservation(
            asset_key=replica_key(replica), metadata={
                # What the asset's page shows until the load is done.
                "load_state": "loaded" if state.chunks_done == state.chunks else "loading",
                "load_table": table,
                "load_rows": dg.MetadataValue.int(state.rows),
                "load_chunks_done": dg.MetadataValue.int(state.chunks_done),
                "load_chunks": dg.MetadataValue.int(state.chunks),
                "load_rows_per_second": dg.MetadataValue.float(
                    round(state.rows_per_second, 1)),
                "load_seconds_to_go": dg.MetadataValue.float(
                    round(state.eta_seconds or 0.0, 1))}))

    return progress


@dg.op(name="apply_loaded", pool=SPARK_POOL,
       description="Apply the loaded rows to the replica and check its row count.")
def apply_loaded(context: dg.OpExecutionContext, loaded: dict, binlake: BinlakeResource
                 ) -> Iterator[dg.AssetMaterialization | dg.AssetCheckEvaluation | dg.Output]:
    from binlog_assets.load.direct import DirectTarget, finish_direct

    if loaded.get("direct") is not None:  # the replica's applies go on, without its rows
        finish_direct(binlake.spark(), binlake.pipeline, DirectTarget(**loaded["direct"]))
    yield from applied_events(binlake, loaded["replica"], "loaded from the source", {
        "load_rows": dg.MetadataValue.int(sum(lo["rows"] for lo in loaded["loads"])),
        "load_chunks": dg.MetadataValue.int(sum(lo["chunks"] for lo in loaded["loads"])),
        "loads": dg.MetadataValue.json(loaded["loads"])}, context.log)
    yield dg.Output(None)


@dg.job(name=LOAD_JOB_NAME, executor_def=dg.in_process_executor,
        description="Load a replica's source tables (launchpad: replica, and one table or "
                    "all), chunk by chunk in parallel without locks, while streaming goes "
                    "on; re-executed from a failure, it resumes after the last committed "
                    "chunk.")
def load_replica_job() -> None:
    apply_loaded(load_chunks(prepare_load(plan_load())))


def initial_load_sensor(pipeline: PipelineConfig) -> dg.SensorDefinition | None:
    """With `load.new_replicas`: a load of each replica that binlake.yaml gained since
    the sensor's last tick (its stream may have built it from a first change already:
    the load brings the rows that were there before), and, at its first tick, of each
    replica never materialized. Once per replica (the run key)."""
    from binlog_assets.parity.check import sources_of

    if not pipeline.load.new_replicas:
        return None
    names = sorted({t.replica for s in pipeline.sources if s.connection is not None
                    for t in s.tables})
    names = [n for n in names if all(s.connection is not None
                                     for s in sources_of(pipeline, n))]
    if not names:
        return None

    @dg.sensor(name="initial_load_sensor", job_name=LOAD_JOB_NAME,
               minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
               description="Launches load_replica_job for each replica new to binlake.yaml "
                           "(load.new_replicas).")
    def sensor(context: dg.SensorEvaluationContext) -> Iterator[dg.RunRequest | dg.SkipReason]:
        known = None if context.cursor is None else set(json.loads(context.cursor))
        wanted = []
        for name in names:
            if known is None:
                if context.instance.get_latest_materialization_event(
                        replica_key(name)) is None:
                    wanted.append(name)
            elif name not in known:
                wanted.append(name)
        for name in wanted:
            context.log.info(f"replica {name}: new, loading its source tables")
            yield dg.RunRequest(
                run_key=f"initial-load-{name}",
                run_config={"ops": {"plan_load": {"config": {"replica": name}}}},
                tags={"binlake/load": name})
        if not wanted:
            yield dg.SkipReason("no replica new since the last tick")
        context.update_cursor(json.dumps(sorted(set(names) | (known or set()))))

    return sensor
