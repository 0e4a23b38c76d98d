"""The initial load on the real stack: MariaDB, Debezium, Kafka, the changelog and Spark's
replica build. A loaded row must equal the row the stream brings; a load while the
source changes must end equal to the source (its parity check passes); a load killed
mid-way resumes and commits each chunk once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict
from datetime import datetime, timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path

import pytest

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.dev.connect import DebeziumFence
from binlog_assets.dev.demo import wait_for_debezium
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.lakehouse.changelog import changelog_uri
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.load.direct import DirectTarget, direct_eligible, finish_direct, prepare_direct
from binlog_assets.load.plan import LoadPlan
from binlog_assets.load.tables import load_first_chunk, load_table, new_plan
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.orchestration.partitions import partition_key
from binlog_assets.orchestration.replica_reports import counted_rows, row_count_check
from binlog_assets.parity.check import check_replica, replica_sources
from binlog_assets.parity.lake import replica_uri
from binlog_assets.parity.lineage import lineage_placer
from binlog_assets.rounds.round import consume_partition

pytestmark = pytest.mark.integration

DB = "loadt"
TABLES = ("wide", "pairs", "names", "coded")
SHARDS = (f"{DB}_1", f"{DB}_2")
REPLICAS = (*TABLES, "orders")
TOPICS = (*(f"shop.{DB}.{t}" for t in TABLES), *(f"shop.{s}.orders" for s in SHARDS),
          f"shop.{DB}.logs")
USER, PASSWORD = "binlake_load", "load-pw"
ROWS = 240
SCHEMA = [
    f"CREATE DATABASE IF NOT EXISTS {DB}",
    f"""CREATE TABLE IF NOT EXISTS {DB}.wide (
        id INT PRIMARY KEY, name VARCHAR(50), price DECIMAL(10,2), weight DOUBLE,
        ratio FLOAT, qty INT UNSIGNED, big BIGINT UNSIGNED, created DATETIME(3),
        seen TIMESTAMP(6) NULL, dur TIME(3), day DATE, payload VARBINARY(16), doc JSON,
        size ENUM('s','m','l'), tags SET('a','b','c'), flag TINYINT(1), yr YEAR,
        note TEXT)""",
    # A composite key.
    f"""CREATE TABLE IF NOT EXISTS {DB}.pairs (
        order_id INT NOT NULL, line SMALLINT NOT NULL, sku VARCHAR(20) NOT NULL,
        amount DECIMAL(12,4), PRIMARY KEY (order_id, line))""",
    # A string key of a case-insensitive collation: chunked by the server's order.
    f"""CREATE TABLE IF NOT EXISTS {DB}.names (
        code VARCHAR(20) COLLATE utf8mb4_general_ci PRIMARY KEY, n INT NOT NULL)""",
    # A replica keyed by `key_columns` (a unique code), not by the primary key.
    f"""CREATE TABLE IF NOT EXISTS {DB}.coded (
        id INT PRIMARY KEY, code CHAR(6) NOT NULL UNIQUE, qty INT)""",
    # Shards with overlapping ids, gathered into one replica by a regex.
    *(f"""CREATE DATABASE IF NOT EXISTS {s}""" for s in SHARDS),
    *(f"""CREATE TABLE IF NOT EXISTS {s}.orders (
        id INT PRIMARY KEY, status VARCHAR(10) NOT NULL)""" for s in SHARDS),
    # No key at all: its replica is a log of changes.
    f"""CREATE TABLE IF NOT EXISTS {DB}.logs (level VARCHAR(10), msg VARCHAR(50))""",
]


def _fill(conn) -> None:
    t0 = datetime(2026, 3, 1, 12, 0, 0)
    with conn.cursor() as cur:
        for statement in SCHEMA:
            cur.execute(statement)
        for i in range(1, ROWS + 1):
            cur.execute(
                f"INSERT INTO {DB}.wide VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                "%s, %s, %s, %s, %s, %s, %s)",
                (i, None if i % 7 == 0 else f"item {i} é", Decimal(i * 37) / 100, i / 3,
                 i / 8, 4_000_000_000 + i, 18_000_000_000_000_000_000 + i,
                 t0 + timedelta(seconds=i, milliseconds=i), t0 + timedelta(minutes=i),
                 timedelta(hours=i % 30, milliseconds=i) * (-1 if i % 11 == 0 else 1),
                 (t0 + timedelta(days=i)).date(), bytes([i % 256, 0, 255]),
                 f'{{"k": {i}, "s": "v{i}"}}', "sml"[i % 3], "a,c" if i % 2 else "b",
                 i % 2, 1990 + i % 50, "x" * (i % 40)))
            cur.execute(f"INSERT INTO {DB}.pairs VALUES (%s, %s, %s, %s)",
                        (i // 3, i % 3, f"sku-{i}", Decimal(i) / 7))
            cur.execute(f"INSERT INTO {DB}.names VALUES (%s, %s)",
                        (f"{'Ab'[i % 2]}-{i:04d}", i))
            cur.execute(f"INSERT INTO {DB}.coded VALUES (%s, %s, %s)", (i, f"c{i:05d}", i % 9))
            for n, shard in enumerate(SHARDS):
                if i <= 100 + 40 * n:
                    cur.execute(f"INSERT INTO {shard}.orders VALUES (%s, %s)", (i, f"s{n}-{i}"))
        cur.execute(f"INSERT INTO {DB}.logs VALUES ('info', 'start'), ('info', 'start')")
        cur.execute("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s", (USER, PASSWORD))
        for database in (DB, *SHARDS):
            cur.execute(f"GRANT SELECT ON {database}.* TO %s@'%%'", (USER,))
        cur.execute("GRANT BINLOG MONITOR ON *.* TO %s@'%%'", (USER,))


def _pipeline(base: PipelineConfig, port: int, **load) -> PipelineConfig:
    data = base.model_dump(mode="json", exclude_none=True)
    suffix = uuid.uuid4().hex[:6]
    data["kafka"]["group.id"] = f"load-{suffix}"
    data["lakehouse"] = {**data["lakehouse"], "database": f"load_{suffix}"}
    data["parity"] = {"chunk_rows": 50, "wait_seconds": 60}
    data["load"] = {"workers": 2, "chunk_rows": 50, **load}
    data["sources"] = [{
        "name": "loadt", "topics": list(TOPICS), "format": "debezium",
        "connection": {"host": "127.0.0.1", "port": port, "user": USER, "password": PASSWORD},
        "tables": [*({"source": f"{DB}.{t}", "replica": t} for t in TABLES if t != "coded"),
                   {"source": f"{DB}.coded", "replica": "coded", "key_columns": ["code"]},
                   {"source": rf"{DB}_\d+\.orders", "replica": "orders"},
                   {"source": f"{DB}.logs", "replica": "logs"}]}]
    return parse_config(data)


def _consume(pipeline: PipelineConfig) -> None:
    for topic in TOPICS:
        consume_partition(pipeline, dict(pipeline.kafka), partition_key(topic, 0),
                          ChangelogRunConfig(), HandlerRegistry(),
                          group=pipeline.kafka["group.id"])


def _load(pipeline: PipelineConfig, replica: str, plan: LoadPlan | None = None,
          direct: DirectTarget | None = None):
    """The replica's source tables loaded, one after another; the last one's load."""
    for source, db, table in replica_sources(pipeline, replica):
        placer = lineage_placer(pipeline, source, db, dict(pipeline.kafka),
                                pipeline.kafka["group.id"])
        done = load_table(pipeline, source, db, table, plan or new_plan(pipeline, db, table),
                          lineage=placer, direct=direct)
    return done


def _prepared(spark, pipeline: PipelineConfig, replica: str) -> tuple[LoadPlan,
                                                                    DirectTarget | None]:
    """A plan of the replica's one source table, and its replica prepared for a load
    appended to it as `load_replica_job` prepares it (None: the replica does not take
    one)."""
    for source, db, table in replica_sources(pipeline, replica):
        plan = new_plan(pipeline, db, table)
        placer = lineage_placer(pipeline, source, db, dict(pipeline.kafka),
                                pipeline.kafka["group.id"])
        target = prepare_direct(spark, pipeline, replica, plan.load_id, partial(
            load_first_chunk, pipeline, source, db, table, plan, lineage=placer))
    return plan, target


def _loaded(spark, pipeline: PipelineConfig, replica: str, *, direct: bool):
    """The replica loaded, straight into it where it takes that and `direct` says so,
    and applied."""
    plan = target = None
    if direct and direct_eligible(pipeline, replica):
        plan, target = _prepared(spark, pipeline, replica)  # None: the table has no rows
    done = _load(pipeline, replica, plan, target)
    if target is not None:
        finish_direct(spark, pipeline, target)
    return done, ReplicaBuilder(spark, pipeline).apply(replica)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and f"\nPPid:\t{pid}\n" in status:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in (Path("/proc") / str(pid) / "status").read_text()
    except OSError:
        return False


def _rows(pipeline: PipelineConfig, replica: str) -> list:
    """The replica's live rows in order, with the source table each came from, without
    binlake's other columns."""
    import pyarrow as pa
    from deltalake import DeltaTable

    table = pa.table(DeltaTable(replica_uri(pipeline, replica)).to_pyarrow_table())
    kept = [c for c in table.column_names
            if not c.startswith("_") or c in ("_source_db", "_source_table")]
    rows = [{c: r[c] for c in kept} for r in table.to_pylist() if r["_op"] in ("c", "u", "r")]
    return sorted(rows, key=lambda r: [repr(r[c]) for c in kept])


@pytest.fixture(scope="module")
def streamed(debezium_fence: DebeziumFence, mariadb: MariaDBServer,
             pipeline_config: PipelineConfig, spark) -> PipelineConfig:
    """The tables as the stream brings them: every row an insert Debezium published."""
    _fill(mariadb.connect())
    pipeline = _pipeline(pipeline_config, mariadb.port)
    wait_for_debezium(dict(pipeline.kafka), list(TOPICS), fence=debezium_fence)
    _consume(pipeline)
    builder = ReplicaBuilder(spark, pipeline)
    for name in (*REPLICAS, "logs"):
        builder.apply(name)
    return pipeline


def test_a_keyless_table_is_refused_naming_the_rule(streamed: PipelineConfig,
                                                    mariadb: MariaDBServer) -> None:
    with pytest.raises(ValueError, match="loadt.logs has no primary key: a load reads a "
                                         "table by chunks of its primary key"):
        _load(_pipeline(streamed, mariadb.port), "logs")


@pytest.mark.parametrize("direct", [False, True], ids=["changelog", "direct"])
def test_a_loaded_replica_equals_the_streamed_one(streamed: PipelineConfig,
                                                  mariadb: MariaDBServer, spark,
                                                  direct: bool) -> None:
    """Through the changelog alone, or appended straight to the replica where it takes
    that (one table keyed by its primary key: wide, pairs, names), typed in the load's
    workers: the same rows, value for value."""
    from deltalake import DeltaTable

    pipeline = _pipeline(streamed, mariadb.port)
    applied = {name: _loaded(spark, pipeline, name, direct=direct) for name in REPLICAS}
    loads = {name: done for name, (done, _) in applied.items()}
    straight = ("wide", "pairs", "names") if direct else ()
    # A direct load's first chunk makes the replica (an apply) before the others are
    # read and appended, each by its worker slot; the apply after the load finds none
    # of their rows to write.
    first = {n: 1 if n in straight else 0 for n in TABLES}
    for name in straight:
        assert applied[name][1].written == 0, applied[name][1]
        txns = DeltaTable(replica_uri(pipeline, name)).transaction_version
        assert [txns(f"binlake-load/{loads[name].load_id}/{s}") for s in (0, 1)] == [5, 4]
    assert {n: (lo.rows, lo.resumed_chunks) for n, lo in loads.items()} == {
        **{n: (ROWS - 50 * first[n], first[n]) for n in TABLES},
        "orders": (140, 0)}  # the second shard's
    assert all(loads[n].chunks == ROWS // 50 + 1 for n in TABLES)  # the last one open
    for name in REPLICAS:
        loaded, stream = _rows(pipeline, name), _rows(streamed, name)
        assert len(loaded) == (240 if name == "orders" else ROWS)
        assert loaded == stream, name
    # Typed as the stream types them: the replica's columns are the streamed replica's.
    for name in REPLICAS:
        assert DeltaTable(replica_uri(pipeline, name)).schema() == \
            DeltaTable(replica_uri(streamed, name)).schema()
    # The changelog stays the truth: the row-count check agrees, and a rebuild from it
    # (which drops the replica's record of the load) gives the same rows.
    builder = ReplicaBuilder(spark, pipeline)
    for name in straight:
        rule = applied[name][1].key_rule
        live = counted_rows(builder, name, rule)
        check = row_count_check(builder, name, rule, live, applied[name][1].applied_version)
        assert check.passed and live == ROWS, check.metadata
        rebuilt = builder.rebuild(name)
        assert rebuilt.written == ROWS and _rows(pipeline, name) == _rows(streamed, name)


def test_a_load_while_the_source_changes_ends_equal(streamed: PipelineConfig,
                                                    mariadb: MariaDBServer,
                                                    debezium_fence: DebeziumFence,
                                                    spark) -> None:
    """Inserts, updates and deletes inside the chunks being read; then the stream is
    consumed and applied over the load, whatever order: the parity check passes."""
    pipeline = _pipeline(streamed, mariadb.port, chunk_rows=20, pause_seconds=0.05)
    stop = threading.Event()
    changes = []

    def workload() -> None:
        conn = mariadb.connect()
        i = 0
        with conn.cursor() as cur:
            while not stop.is_set() and i < 400:
                i += 1
                key = 1 + (i * 37) % ROWS
                cur.execute(f"UPDATE {DB}.wide SET name = %s, price = price + 1 WHERE id = %s",
                            (f"changed {i}", key))
                cur.execute(f"DELETE FROM {DB}.pairs WHERE order_id = %s AND line = %s",
                            (key // 3, key % 3))
                cur.execute(f"INSERT INTO {DB}.names VALUES (%s, %s) "
                            "ON DUPLICATE KEY UPDATE n = n + 1000", (f"c-{i:04d}", i))
                changes.append(i)
                time.sleep(0.005)

    worker = threading.Thread(target=workload)
    worker.start()
    try:
        for name in REPLICAS:  # straight into the replica where it takes that
            _loaded(spark, pipeline, name, direct=True)
    finally:
        stop.set()
        worker.join()
    assert changes, "the workload changed nothing during the load"
    wait_for_debezium(dict(pipeline.kafka), list(TOPICS), fence=debezium_fence)
    _consume(pipeline)
    builder = ReplicaBuilder(spark, pipeline)
    for name in REPLICAS:
        builder.apply(name)
        report = check_replica(pipeline, name, dict(pipeline.kafka),
                               pipeline.kafka["group.id"])
        assert report.passed, (name, report.summary(), report.mismatches)


def test_a_killed_load_resumes_and_commits_each_chunk_once(
        streamed: PipelineConfig, mariadb: MariaDBServer, debezium_fence: DebeziumFence,
        spark, tmp_path: Path) -> None:
    import yaml
    from deltalake import DeltaTable

    pipeline = _pipeline(streamed, mariadb.port, chunk_rows=10, pause_seconds=0.3)
    # Prepared as the job's prepare_load does: the replica made of the first chunk and
    # held; the load appends the others to it and the changelog (the job's load_chunks).
    plan, target = _prepared(spark, pipeline, "wide")
    assert target is not None and target.first == 1
    assert len(plan.uppers) == ROWS // 10 + 1 and plan.workers == 2
    config = tmp_path / "binlake.yaml"
    config.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_none=True)))
    (tmp_path / "plan.json").write_text(plan.to_json())
    (tmp_path / "target.json").write_text(json.dumps(asdict(target)))
    script = (
        "import json, sys; from pathlib import Path\n"
        "from binlog_assets.config import load_config\n"
        "from binlog_assets.load.direct import DirectTarget\n"
        "from binlog_assets.load.plan import LoadPlan\n"
        "from tests.load.test_load_integration import _load\n"
        "plan = LoadPlan.from_json(Path(sys.argv[2]).read_text())\n"
        "target = DirectTarget(**json.loads(Path(sys.argv[3]).read_text()))\n"
        "_load(load_config(sys.argv[1]), 'wide', plan, target)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(config),
                             str(tmp_path / "plan.json"), str(tmp_path / "target.json")],
                            cwd=Path(__file__).parents[2])
    uri = changelog_uri(pipeline)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if DeltaTable.is_deltatable(uri) and len(
                [h for h in DeltaTable(uri).history() if "load/" in str(h)]) >= 4:
            break
        assert proc.poll() is None, "the load ended before it was killed"
        time.sleep(0.1)
    workers = _children(proc.pid)
    assert len(workers) == 2, workers
    os.kill(proc.pid, signal.SIGKILL)  # the run's process dies; its workers die with it
    proc.wait()
    deadline = time.monotonic() + 10
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(w) for w in workers), "a load worker outlived its parent"
    committed = DeltaTable(uri).to_pyarrow_table(columns=["op"]).num_rows
    assert 0 < committed < ROWS
    # Held by the load: an apply meanwhile writes nothing.
    assert ReplicaBuilder(spark, pipeline).apply("wide").held

    resumed = _load(pipeline, "wide", plan, target)
    assert resumed.resumed_chunks >= 4
    assert resumed.rows == ROWS - committed  # only the chunks not committed were read
    rows = DeltaTable(uri).to_pyarrow_table(columns=["key"]).column("key").to_pylist()
    assert len(rows) == len(set(rows)) == ROWS  # every key once: no chunk committed twice
    # Nor twice to the replica: every key once there too, before the apply after the load.
    ids = DeltaTable(replica_uri(pipeline, "wide")).to_pyarrow_table(
        columns=["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids)) == ROWS
    finish_direct(spark, pipeline, target)
    wide = ReplicaBuilder(spark, pipeline).apply("wide")
    assert wide.written == 0 and len(_rows(pipeline, "wide")) == ROWS, wide
    # With the stream consumed over it, the replica is its source's.
    wait_for_debezium(dict(pipeline.kafka), list(TOPICS), fence=debezium_fence)
    _consume(pipeline)
    ReplicaBuilder(spark, pipeline).apply("wide")
    report = check_replica(pipeline, "wide", dict(pipeline.kafka), pipeline.kafka["group.id"])
    assert report.passed, (report.summary(), report.mismatches)


def test_the_load_job_loads_a_replica_and_reports_its_progress(
        streamed: PipelineConfig, mariadb: MariaDBServer, tmp_path: Path) -> None:
    """From the launchpad: the plan, the chunks (an observation of progress at the end),
    the replica applied and its row-count check passed."""
    import dagster as dg
    import yaml

    from binlog_assets.orchestration.load_job import LOAD_JOB_NAME, load_replica_job
    from binlog_assets.orchestration.replica_assets import build_replica_assets
    from binlog_assets.orchestration.resources import BinlakeResource

    pipeline = _pipeline(streamed, mariadb.port)
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_none=True)))
    defs = dg.Definitions(assets=[build_replica_assets(pipeline)], jobs=[load_replica_job],
                          resources={"binlake": BinlakeResource(config_path=str(path))})
    result = defs.resolve_job_def(LOAD_JOB_NAME).execute_in_process(run_config={
        "ops": {"plan_load": {"config": {"replica": "names"}}}})
    assert result.success
    observed = [e.event_specific_data.asset_observation.metadata for e in result.all_events
                if e.event_type_value == "ASSET_OBSERVATION"]
    # The first chunk read by a worker, then the end's (the load takes less than 10 s).
    # The plan's first chunk made the replica before the load: it counts as done when
    # its worker says so, before or after the other worker's first chunk.
    done = [(m["load_chunks_done"].value, m["load_chunks"].value) for m in observed]
    total = done[-1][1]
    assert total >= ROWS // 50 + 1 and len(done) == 2 and done[1] == (total, total)
    assert done[0][0] in (1, 2), done
    assert [m["load_state"].value for m in observed] == ["loading", "loaded"]
    assert observed[-1]["load_chunks"].value >= ROWS // 50 + 1
    [materialized] = result.asset_materializations_for_node("apply_loaded")
    assert materialized.asset_key == dg.AssetKey(["replica", "names"])
    live = len(_rows(pipeline, "names"))
    assert materialized.metadata["load_rows"].value == live > 0
    [check] = result.get_asset_check_evaluations()
    assert check.passed, check.metadata


def test_a_table_added_while_streaming_is_loaded_and_followed(
        streamed: PipelineConfig, mariadb: MariaDBServer, debezium_fence: DebeziumFence,
        spark, tmp_path: Path) -> None:
    """`loadt.late` held rows before binlake followed it (its stream starts at the
    topic's end, as a connector with `snapshot.mode: no_data` would). binlake.yaml gains
    it: `initial_load_sensor` launches its load, the job loads it, and the stream goes
    on into the same replica: it ends equal to its source, twice."""
    import dagster as dg
    import yaml
    from confluent_kafka import Consumer, TopicPartition

    from binlog_assets.orchestration.load_job import (
        LOAD_JOB_NAME,
        initial_load_sensor,
        load_replica_job,
    )
    from binlog_assets.orchestration.replica_assets import build_replica_assets
    from binlog_assets.orchestration.resources import BinlakeResource

    topic = f"shop.{DB}.late"
    with mariadb.connect().cursor() as cur:
        cur.execute(f"CREATE TABLE {DB}.late (id INT PRIMARY KEY, v VARCHAR(20))")
        cur.executemany(f"INSERT INTO {DB}.late VALUES (%s, %s)",
                        [(i, f"before {i}") for i in range(1, 121)])
    wait_for_debezium(dict(streamed.kafka), [topic], fence=debezium_fence)
    consumer = Consumer({**streamed.kafka, "group.id": "load-late-probe"})
    _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.close()

    before = _pipeline(streamed, mariadb.port, new_replicas=True)
    sensor = initial_load_sensor(before)
    data = before.model_dump(mode="json", exclude_none=True)
    data["sources"][0]["topics"].append(topic)
    data["sources"][0]["tables"].append({"source": f"{DB}.late", "replica": "late"})
    after = parse_config(data)
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(after.model_dump(mode="json", exclude_none=True)))
    with dg.instance_for_test() as instance:
        for name in (*REPLICAS, "logs"):  # built before: the first tick takes none of them
            instance.report_runless_asset_event(dg.AssetMaterialization(
                asset_key=dg.AssetKey(["replica", name])))
        first = dg.build_sensor_context(instance=instance)
        assert [r for r in sensor(first) if isinstance(r, dg.RunRequest)] == []
        later = dg.build_sensor_context(instance=instance, cursor=first.cursor)
        [request] = [r for r in initial_load_sensor(after)(later)
                     if isinstance(r, dg.RunRequest)]
    assert request.run_config["ops"]["plan_load"]["config"] == {"replica": "late"}
    with mariadb.connect().cursor() as cur:  # changes the stream brings
        cur.execute(f"UPDATE {DB}.late SET v = 'changed' WHERE id <= 10")
        cur.execute(f"DELETE FROM {DB}.late WHERE id > 110")
    wait_for_debezium(dict(after.kafka), [*TOPICS, topic], fence=debezium_fence)
    # The new table's stream from where its connector would have begun.
    consume_partition(after, dict(after.kafka), partition_key(topic, 0),
                      ChangelogRunConfig(start_offset=end), HandlerRegistry(),
                      group=after.kafka["group.id"])
    _consume(after)
    defs = dg.Definitions(assets=[build_replica_assets(after)], jobs=[load_replica_job],
                          resources={"binlake": BinlakeResource(config_path=str(path))})
    result = defs.resolve_job_def(LOAD_JOB_NAME).execute_in_process(
        run_config=request.run_config)
    assert result.success
    for round_ in range(2):
        wait_for_debezium(dict(after.kafka), [*TOPICS, topic], fence=debezium_fence)
        consume_partition(after, dict(after.kafka), partition_key(topic, 0),
                          ChangelogRunConfig(), HandlerRegistry(),
                          group=after.kafka["group.id"])
        _consume(after)
        ReplicaBuilder(spark, after).apply("late")
        report = check_replica(after, "late", dict(after.kafka), after.kafka["group.id"])
        assert report.passed, (round_, report.summary(), report.mismatches)
        assert report.source_rows == (110 if round_ == 0 else 111)
        if round_ == 0:
            with mariadb.connect().cursor() as cur:  # followed: a change after the load
                cur.execute(f"INSERT INTO {DB}.late VALUES (500, 'after the load')")
