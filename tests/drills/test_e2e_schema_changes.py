"""Schema changes, from a real binlog: MariaDB runs the DDL, Debezium
publishes it (the schema-change topic and the row topics, consumed apart), bounded
consumer runs write the changelog, Spark applies it; after each phase every `evolve`
replica equals its source table, columns and rows.

Phases: (1) DROP COLUMN, RENAME COLUMN, CHANGE COLUMN, MODIFY to wider types, with
rows changed between them; an `exception` replica refuses, an `ignore` one keeps its
columns; then ADD COLUMN with a default and NOT NULL to a table with rows (also the
parenthesised form and a TIMESTAMP defaulting to the current time), and a column
dropped and added again in one batch (older rows take the default). (2) RENAME TABLE
within a replica's regex, DROP TABLE under `on_drop: truncate` and `keep`, DROP
DATABASE, DROP PARTITION (noted: its rows leave the source unlogged). (3) A new shard
joining by topic regex. Then each replica is rebuilt from the whole changelog in one
batch and compared again.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import threading
import time
import uuid
from decimal import Decimal

import pyarrow as pa
import pymysql
import pytest
from confluent_kafka import Consumer

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.lag import topic_partitions
from binlog_assets.dev.connect import DebeziumFence, KafkaConnect
from binlog_assets.dev.demo import wait_for_debezium
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.lakehouse.schema import SchemaEvolutionError
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.parity.lake import LIVE_OPS, replica_uri
from binlog_assets.rounds.round import consume_partition

DB, DB2 = "ddl_e2e", "ddl_e2e_db"
PREFIX = "shop"  # the session connector's topic prefix; `shop` is its schema-change topic
TABLES = [
    {"source": f"{DB}.plain", "replica": "plain"},
    {"source": rf"{DB}\.items(_v2)?", "replica": "items"},
    {"source": f"{DB}.strict", "replica": "strict", "schema_evolution": "exception"},
    {"source": f"{DB}.loose", "replica": "loose", "schema_evolution": "ignore"},
    {"source": f"{DB}.gone", "replica": "gone"},
    {"source": f"{DB}.kept", "replica": "kept", "on_drop": "keep"},
    {"source": f"{DB}.parted", "replica": "parted"},
    {"source": f"{DB2}.t", "replica": "dbwide"},
]
SHARDS = r"ddl_e2e_s\d+"
TABLES.append({"source": rf"{SHARDS}\.orders", "replica": "orders"})
SOURCE_TABLES = ["plain", "items", "items_v2", "strict", "loose", "gone", "kept", "parted"]
# The shards' topics by regex: a shard created later joins with no config change.
TOPICS = [PREFIX, *(f"{PREFIX}.{DB}.{t}" for t in SOURCE_TABLES), f"{PREFIX}.{DB2}.t",
          rf"^{PREFIX}\.{SHARDS}\.orders$"]
METADATA = {"_source_db", "_source_table", "_position", "_op", "_source_ts", "_applied_at"}


def _config(base: PipelineConfig, topics: list[str] = TOPICS,
            tables: list[dict] = TABLES) -> PipelineConfig:
    data = base.model_dump(mode="json", exclude_none=True)
    data["kafka"]["group.id"] = f"ddl-e2e-{uuid.uuid4().hex[:6]}"
    data["lakehouse"] = {**data["lakehouse"], "database": f"ddl_e2e_{uuid.uuid4().hex[:6]}"}
    data["sources"] = [{"name": "ddl", "topics": topics, "format": "debezium",
                        "tables": tables}]
    return parse_config(data)


def _norm(value):
    if isinstance(value, Decimal):
        return format(value.normalize(), "f")
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=None).isoformat()
    return value


def _source(conn, table: str) -> tuple[list[str], set[tuple]]:
    with conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {table}")
        columns = [d[0].lower() for d in cur.description]
        return columns, {tuple(_norm(v) for v in row) for row in cur.fetchall()}


def _replica(spark, pipeline: PipelineConfig, replica: str, columns: list[str] | None = None
             ) -> tuple[list[str], set[tuple]]:
    """The replica's live rows as a reader outside Spark gets them (the README's filter
    on `_op`): a Spark read of `_current` costs a second each, and the shards' and the
    renamed table's checks below read the views."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    table = DeltaTable(replica_uri(pipeline, replica)).to_pyarrow_table()
    table = table.filter(pc.is_in(table.column("_op"), pa.array(LIVE_OPS)))
    have = [c for c in table.column_names if c not in METADATA]
    picked = columns or have
    rows = {tuple(_norm(r[c]) for c in picked) for r in table.select(picked).to_pylist()}
    return [c.lower() for c in have], rows


def _run(conn, statements: list[str]) -> None:
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def _consume(pipeline: PipelineConfig, fence: DebeziumFence, expect: list[str]) -> None:
    """One bounded run per topic-partition of the source (its regex expanded as the
    discovery sensor does), once the `expect`ed tables' topics exist, up to what
    Debezium has published."""
    kafka_conf = dict(pipeline.kafka)
    wanted = {PREFIX, *(f"{PREFIX}.{t}" for t in expect)}
    consumer = Consumer({**kafka_conf, "group.id": "ddl-e2e-discovery"})
    try:
        deadline = time.monotonic() + 120
        while True:
            found = {t for t, _ in topic_partitions(consumer, list(pipeline.sources[0].topics))}
            if wanted <= found:
                break
            assert time.monotonic() < deadline, (wanted, found)
            time.sleep(0.5)
    finally:
        consumer.close()
    ends = wait_for_debezium(kafka_conf, sorted(found), fence=fence)
    for key in ends:
        summary, _ = consume_partition(pipeline, kafka_conf, key, ChangelogRunConfig(),
                                       HandlerRegistry(), group=pipeline.kafka["group.id"])
        assert summary.committed_offset == ends[key], (key, summary)


def _assert_equal(conn, spark, pipeline: PipelineConfig, replica: str, source: str) -> None:
    src_columns, src_rows = _source(conn, source)
    rep_columns, read = _replica(spark, pipeline, replica)
    assert sorted(rep_columns) == sorted(src_columns), (replica, rep_columns, src_columns)
    # Spark fixes a view's columns when it is made: `_current` must follow the table's.
    view = spark.table(f"`{pipeline.lakehouse.database}`.`{replica}_current`").columns
    assert [c.lower() for c in view if c not in METADATA] == rep_columns, (replica, view)
    order = [rep_columns.index(c) for c in src_columns]
    rep_rows = {tuple(r[i] for i in order) for r in read}
    assert rep_rows == src_rows, (replica, rep_rows ^ src_rows)


def test_schema_changes_through_debezium_follow_each_mode(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, debezium_fence: DebeziumFence,
    pipeline_config: PipelineConfig,
    spark,
) -> None:
    pipeline = _config(pipeline_config)
    conn = mariadb.connect()
    _run(conn, [
        "SET time_zone = '+00:00'",  # TIMESTAMPs read as the replica holds them: UTC
        *(f"DROP DATABASE IF EXISTS {d}" for d in (DB, DB2, "ddl_e2e_s1", "ddl_e2e_s2")),
        f"CREATE DATABASE {DB}", f"CREATE DATABASE {DB2}", "CREATE DATABASE ddl_e2e_s1",
        "CREATE TABLE ddl_e2e_s1.orders (id INT PRIMARY KEY, amount DECIMAL(10,2))",
        *(f"INSERT INTO ddl_e2e_s1.orders VALUES ({i}, {i}.50)" for i in range(1, 4)),
        f"CREATE TABLE {DB}.plain (id INT PRIMARY KEY, qty INT, name VARCHAR(10), "
        "price DECIMAL(10,2), note VARCHAR(20), old_name VARCHAR(20))",
        f"CREATE TABLE {DB}.items (id INT PRIMARY KEY, label VARCHAR(20))",
        f"CREATE TABLE {DB}.strict (id INT PRIMARY KEY, note VARCHAR(20))",
        f"CREATE TABLE {DB}.loose (id INT PRIMARY KEY, note VARCHAR(20), v INT)",
        f"CREATE TABLE {DB}.gone (id INT PRIMARY KEY, v INT)",
        f"CREATE TABLE {DB}.kept (id INT PRIMARY KEY, v INT)",
        f"CREATE TABLE {DB2}.t (id INT PRIMARY KEY, v INT)",
        f"CREATE TABLE {DB}.parted (id INT PRIMARY KEY, v INT) PARTITION BY RANGE (id) "
        "(PARTITION p0 VALUES LESS THAN (10), PARTITION p1 VALUES LESS THAN MAXVALUE)",
        f"INSERT INTO {DB}.parted VALUES (1, 1), (2, 2), (11, 11), (12, 12)",
        *(f"INSERT INTO {DB}.plain VALUES ({i}, {i}, 'n{i}', {i}.25, 'note{i}', 'o{i}')"
          for i in range(1, 6)),
        *(f"INSERT INTO {DB}.items VALUES ({i}, 'l{i}')" for i in range(1, 5)),
        *(f"INSERT INTO {DB}.{t} VALUES ({i}, 'x{i}')" for t in ("strict",)
          for i in range(1, 3)),
        *(f"INSERT INTO {DB}.loose VALUES ({i}, 'x{i}', {i})" for i in range(1, 3)),
        *(f"INSERT INTO {t} VALUES ({i}, {i})" for t in (f"{DB}.gone", f"{DB}.kept",
                                                         f"{DB2}.t") for i in range(1, 4)),
    ])
    initial = [f"{DB}.{t}" for t in SOURCE_TABLES if t != "items_v2"]
    _consume(pipeline, debezium_fence, [*initial, f"{DB2}.t", "ddl_e2e_s1.orders"])
    builder = ReplicaBuilder(spark, pipeline)
    for replica in ("plain", "items", "strict", "loose", "gone", "kept", "dbwide", "orders",
                    "parted"):
        builder.apply(replica)
    for replica, source in (("plain", "plain"), ("items", "items"), ("strict", "strict"),
                            ("loose", "loose"), ("gone", "gone"), ("kept", "kept"),
                            ("parted", "parted")):
        _assert_equal(conn, spark, pipeline, replica, f"{DB}.{source}")
    _assert_equal(conn, spark, pipeline, "dbwide", f"{DB2}.t")
    kept_before = _replica(spark, pipeline, "kept")

    # Phase 1: column changes, with rows changed between them.
    _run(conn, [
        f"ALTER TABLE {DB}.plain DROP COLUMN note",
        f"UPDATE {DB}.plain SET qty = qty + 10 WHERE id = 1",
        f"ALTER TABLE {DB}.plain RENAME COLUMN old_name TO new_name",
        f"UPDATE {DB}.plain SET new_name = 'renamed' WHERE id = 2",
        f"ALTER TABLE {DB}.plain CHANGE COLUMN new_name newer_name VARCHAR(20)",
        f"ALTER TABLE {DB}.plain MODIFY qty BIGINT, MODIFY name VARCHAR(200), "
        "MODIFY price DECIMAL(12,2)",
        f"INSERT INTO {DB}.plain VALUES (10, 5000000000, '{'w' * 150}', 1234567890.12, 'big')",
        f"DELETE FROM {DB}.plain WHERE id = 5",
        f"ALTER TABLE {DB}.strict DROP COLUMN note",
        f"ALTER TABLE {DB}.loose DROP COLUMN note, RENAME COLUMN v TO w",
        f"INSERT INTO {DB}.loose VALUES (10, 7)",
    ])
    _consume(pipeline, debezium_fence, initial)
    result = builder.apply("plain")
    _assert_equal(conn, spark, pipeline, "plain", f"{DB}.plain")
    changes = set(result.schema_changes)
    assert {"drop column note", f"rename column old_name -> new_name ({DB}.plain)",
            f"rename column new_name -> newer_name ({DB}.plain)"} <= changes, changes
    assert any(c.startswith("widen qty int -> bigint") for c in changes), changes
    assert any(c.startswith("widen price decimal(10,2) -> decimal(12,2)")
               for c in changes), changes
    with pytest.raises(SchemaEvolutionError, match=r"'strict'.*drop column note"):
        builder.apply("strict")
    builder.apply("loose")
    loose_columns, loose_rows = _replica(spark, pipeline, "loose")
    assert loose_columns == ["id", "note", "v"], loose_columns  # as it was: ignore
    assert {r[0] for r in loose_rows} == {1, 2, 10}, loose_rows

    # Phase 1b: columns added to a table with rows, one dropped and added again, in one
    # batch. MariaDB gives the existing rows each new column's default; the binlog has no
    # row events for that, so the replica must give it too.
    _run(conn, [
        f"ALTER TABLE {DB}.plain ADD COLUMN tag VARCHAR(10) DEFAULT 'std'",
        f"UPDATE {DB}.plain SET tag = 'vip' WHERE id = 2",
        f"ALTER TABLE {DB}.plain ADD COLUMN cnt INT NOT NULL AFTER qty",
        f"ALTER TABLE {DB}.plain DROP COLUMN newer_name",
        f"UPDATE {DB}.plain SET qty = qty + 1 WHERE id = 3",
        f"ALTER TABLE {DB}.plain ADD COLUMN newer_name VARCHAR(20)",
        # The parenthesised form, and a TIMESTAMP whose older rows hold the ALTER's time.
        f"ALTER TABLE {DB}.plain ADD (lvl INT NOT NULL DEFAULT 3, memo VARCHAR(8) "
        "DEFAULT 'm')",
        f"UPDATE {DB}.plain SET lvl = 9 WHERE id = 1",
        f"ALTER TABLE {DB}.plain ADD COLUMN seen TIMESTAMP NOT NULL "
        "DEFAULT CURRENT_TIMESTAMP",
        f"INSERT INTO {DB}.plain (id, qty, cnt, newer_name) VALUES (20, 1, 4, 'fresh')",
    ])
    _consume(pipeline, debezium_fence, initial)
    added = builder.apply("plain")
    _assert_equal(conn, spark, pipeline, "plain", f"{DB}.plain")
    assert {f"add column tag ({DB}.plain): older rows hold 'std'",
            f"add column cnt ({DB}.plain): older rows hold 0",
            f"add column newer_name ({DB}.plain): older rows hold NULL",
            f"add column lvl ({DB}.plain): older rows hold 3",
            f"add column memo ({DB}.plain): older rows hold 'm'",
            } <= set(added.schema_changes), added.schema_changes
    assert any(c.startswith(f"add column seen ({DB}.plain): older rows hold TIMESTAMP '")
               for c in added.schema_changes), added.schema_changes

    # Phase 2: tables and databases.
    _run(conn, [
        f"RENAME TABLE {DB}.items TO {DB}.items_v2",
        f"INSERT INTO {DB}.items_v2 VALUES (100, 'after')",
        f"UPDATE {DB}.items_v2 SET label = 'updated' WHERE id = 1",
        f"DROP TABLE {DB}.gone", f"DROP TABLE {DB}.kept", f"DROP DATABASE {DB2}",
        f"ALTER TABLE {DB}.parted DROP PARTITION p0",
    ])
    _consume(pipeline, debezium_fence, [f"{DB}.items_v2"])
    items = builder.apply("items")
    _assert_equal(conn, spark, pipeline, "items", f"{DB}.items_v2")
    tables = {r["_source_table"] for r in spark.table(
        f"`{pipeline.lakehouse.database}`.`items_current`").collect()}
    assert tables == {"items_v2"}, tables
    assert f"move rows {DB}.items -> {DB}.items_v2" in items.schema_changes, items
    gone = builder.apply("gone")
    assert _replica(spark, pipeline, "gone")[1] == set()
    assert f"drop table {DB}.gone: its rows leave the replica" in gone.schema_changes, gone
    kept = builder.apply("kept")
    assert _replica(spark, pipeline, "kept") == kept_before
    assert f"drop table {DB}.kept: rows kept" in kept.schema_changes, kept
    builder.apply("dbwide")
    assert _replica(spark, pipeline, "dbwide")[1] == set()
    # Rows a partition drop took are not in the binlog: the apply says to re-snapshot.
    parted = builder.apply("parted")
    assert any(c.startswith(f"DROP PARTITION p0 on {DB}.parted: the source's rows") and
               c.endswith(f"(re-snapshot {DB}.parted to bring it level)")
               for c in parted.schema_changes), parted
    # Later applies change nothing more: the drops and renames are applied once.
    again = builder.apply("plain")
    assert (again.schema_changes, again.written) == ((), 0), again
    assert builder.apply("plain").skipped
    _assert_equal(conn, spark, pipeline, "plain", f"{DB}.plain")

    # Phase 3: a new shard; its topic matches the source's regex, its table the replica's.
    _assert_shards(conn, spark, pipeline, ["ddl_e2e_s1"])
    _run(conn, ["CREATE DATABASE ddl_e2e_s2",
                "CREATE TABLE ddl_e2e_s2.orders (id INT PRIMARY KEY, amount DECIMAL(10,2))",
                *(f"INSERT INTO ddl_e2e_s2.orders VALUES ({i}, {i}.75)" for i in range(1, 3)),
                "UPDATE ddl_e2e_s1.orders SET amount = 9.99 WHERE id = 1"])
    _consume(pipeline, debezium_fence, ["ddl_e2e_s2.orders"])
    builder.apply("orders")
    _assert_shards(conn, spark, pipeline, ["ddl_e2e_s1", "ddl_e2e_s2"])

    # A rebuild reads the whole changelog in one batch, every DDL above in it, and must
    # come out as the source tables are now, as the applies did step by step.
    rebuilt = builder.rebuild("plain")
    _assert_equal(conn, spark, pipeline, "plain", f"{DB}.plain")
    assert {"drop column note", f"rename column old_name -> new_name ({DB}.plain)"
            } <= set(rebuilt.schema_changes), rebuilt.schema_changes
    builder.rebuild("items")
    _assert_equal(conn, spark, pipeline, "items", f"{DB}.items_v2")
    for replica in ("gone", "dbwide"):
        builder.rebuild(replica)
        assert _replica(spark, pipeline, replica)[1] == set(), replica
    builder.rebuild("orders")
    _assert_shards(conn, spark, pipeline, ["ddl_e2e_s1", "ddl_e2e_s2"])


def _assert_shards(conn, spark, pipeline: PipelineConfig, shards: list[str]) -> None:
    source = {(shard, *row) for shard in shards
              for row in _source(conn, f"{shard}.orders")[1]}
    replica = {(r["_source_db"], r["id"], _norm(r["amount"])) for r in spark.table(
        f"`{pipeline.lakehouse.database}`.`orders_current`").collect()}
    assert replica == source, replica ^ source


OSC = "osc_e2e"


def test_pt_online_schema_change_cut_over_leaves_the_replica_equal(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, debezium_fence: DebeziumFence,
    pipeline_config: PipelineConfig,
    spark,
) -> None:
    # The helper's topic comes with the database's regex, as a user would subscribe.
    pipeline = _config(pipeline_config, [PREFIX, rf"^{PREFIX}\.{OSC}\..*"],
                  [{"source": f"{OSC}.orders", "replica": "orders"}])
    conn = mariadb.connect()
    _run(conn, [f"DROP DATABASE IF EXISTS {OSC}", f"CREATE DATABASE {OSC}",
                f"CREATE TABLE {OSC}.orders (id INT PRIMARY KEY, amount DECIMAL(10,2), "
                "note VARCHAR(20), qty INT)",
                f"INSERT INTO {OSC}.orders VALUES "
                + ", ".join(f"({i}, {i}.25, 'n{i}', {i % 7})" for i in range(1, 1201))])
    _consume(pipeline, debezium_fence, [f"{OSC}.orders"])
    builder = ReplicaBuilder(spark, pipeline)
    builder.apply("orders")
    _assert_equal(conn, spark, pipeline, "orders", f"{OSC}.orders")

    # Writes keep coming while the tool copies in chunks: its triggers bring them over.
    done = threading.Event()
    writes = {"n": 0}

    def write() -> None:
        own = mariadb.connect()
        i = 0
        while not done.is_set():
            i += 1
            for statement in (
                    f"UPDATE {OSC}.orders SET qty = qty + 1 WHERE id = {(i * 37) % 1200 + 1}",
                    f"DELETE FROM {OSC}.orders WHERE id = {(i * 53) % 1200 + 1}",
                    f"INSERT INTO {OSC}.orders (id, amount, qty) VALUES ({2000 + i}, 1.5, 1)"):
                try:
                    _run(own, [statement])
                    writes["n"] += 1
                except pymysql.err.OperationalError as e:
                    # A deadlock or lock wait with the tool's chunk copy: the statement
                    # did not happen, at the source or in its binlog; the app moves on.
                    if e.args[0] not in (1205, 1213):
                        raise
        own.close()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        tool = subprocess.run(
            ["pt-online-schema-change", "--alter",
             "DROP COLUMN note, ADD COLUMN tag VARCHAR(10) NOT NULL DEFAULT 'std'",
             "--execute", "--recursion-method=none", "--chunk-size=100",
             f"S={mariadb.socket},u=root,D={OSC},t=orders"],
            capture_output=True, text=True, timeout=300)
    finally:
        done.set()
        writer.join()
    assert tool.returncode == 0, tool.stdout + tool.stderr
    assert "Swapped original and new tables OK" in tool.stdout, tool.stdout
    assert writes["n"] > 0
    _run(conn, [f"UPDATE {OSC}.orders SET tag = 'vip' WHERE id <= 10",
                f"INSERT INTO {OSC}.orders (id, amount, qty) VALUES (5000, 5.00, 5)"])
    _consume(pipeline, debezium_fence, [f"{OSC}._orders_new"])
    result = builder.apply("orders")
    assert any(c.startswith(f"table {OSC}._orders_new renamed to {OSC}.orders: the "
                            "replica's rows") for c in result.schema_changes), result
    assert "drop column note" in result.schema_changes, result
    _assert_equal(conn, spark, pipeline, "orders", f"{OSC}.orders")
    assert builder.apply("orders").skipped
    # Built again from the whole changelog, the swap in the same batch as everything.
    builder.rebuild("orders")
    _assert_equal(conn, spark, pipeline, "orders", f"{OSC}.orders")


FUZZ = "fuzz_e2e"


class _Workload:
    """A seeded mix of row changes and schema changes on two MariaDB tables, as a shop's
    application and its DBAs make them: `t1` is altered in place and by
    pt-online-schema-change, `t2` in place and renamed within its replica's regex."""

    KINDS = {"int": "INT", "str": "VARCHAR(20)", "dec": "DECIMAL(8,2)"}

    def __init__(self, conn, rng) -> None:
        self.conn, self.rng = conn, rng
        self.names = {"t1": "t1", "t2": "t2"}  # table role -> current name
        self.columns = {t: {"a": "int", "b": "str"} for t in self.names}
        self.written: set[str] = set()  # tables with row events: their topics exist
        self.serial = 0

    def _next(self) -> int:
        self.serial += 1
        return self.serial

    def _value(self, kind: str) -> str:
        r = self.rng
        return {"int": lambda: str(r.randint(-50, 10**6)),
                "str": lambda: f"'{r.choice(['x', 'yy', 'zzz'])}{r.randint(0, 99)}'",
                "dec": lambda: f"{r.randint(0, 9999)}.{r.randint(0, 99):02d}"}[kind]()

    def table(self, role: str) -> str:
        return f"{FUZZ}.{self.names[role]}"

    def rows(self, role: str) -> None:
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT id FROM {self.table(role)}")
            ids = [r[0] for r in cur.fetchall()]
        statements = []
        for _ in range(self.rng.randint(3, 12)):
            op = self.rng.choice(["insert", "insert", "update", "update", "delete"])
            columns = self.columns[role]
            if op == "insert" or not ids:
                i = self._next()
                names = ["id", *columns]
                values = [str(i), *(self._value(k) for k in columns.values())]
                statements.append(f"INSERT INTO {self.table(role)} ({', '.join(names)}) "
                                  f"VALUES ({', '.join(values)})")
                ids.append(i)
            elif op == "update":
                column = self.rng.choice(sorted(columns))
                statements.append(f"UPDATE {self.table(role)} SET {column} = "
                                  f"{self._value(columns[column])} WHERE id = "
                                  f"{self.rng.choice(ids)}")
            else:
                gone = ids.pop(self.rng.randrange(len(ids)))
                statements.append(f"DELETE FROM {self.table(role)} WHERE id = {gone}")
        _run(self.conn, statements)
        self.written.add(self.names[role])

    def alter(self, role: str) -> str:
        """One ALTER clause for `role`, its column record updated."""
        columns = self.columns[role]
        choice = self.rng.choice(["add", "add", "drop", "rename", "widen"])
        if choice == "drop" and len(columns) > 1:
            column = self.rng.choice(sorted(columns))
            del columns[column]
            return f"DROP COLUMN {column}"
        if choice == "rename":
            column = self.rng.choice(sorted(columns))
            new = f"c{self._next()}"
            columns[new] = columns.pop(column)
            return f"RENAME COLUMN {column} TO {new}"
        if choice == "widen":
            for column, kind in sorted(columns.items()):
                if kind in ("int", "str"):
                    wider = "BIGINT" if kind == "int" else "VARCHAR(80)"
                    return f"MODIFY {column} {wider}"
        kind = self.rng.choice(sorted(self.KINDS))
        column = f"c{self._next()}"
        columns[column] = kind
        default = self.rng.choice([None, self._value(kind)])
        null = self.rng.choice(["", " NOT NULL"]) if default is not None else ""
        return (f"ADD COLUMN {column} {self.KINDS[kind]}{null}"
                + (f" DEFAULT {default}" if default is not None else ""))

    def step(self, mariadb: MariaDBServer) -> str:
        """One random step; what it did."""
        role = self.rng.choice(["t1", "t2"])
        what = self.rng.choice(["rows", "rows", "rows", "alter", "osc", "rename", "truncate"])
        if what == "osc" or (what == "rename" and role == "t1"):
            role = "t1"  # the tool runs on t1; t2 is renamed
        if what == "rows":
            self.rows(role)
        elif what == "alter":
            _run(self.conn, [f"ALTER TABLE {self.table(role)} {self.alter(role)}"])
        elif what in ("osc", "rename") and role == "t1":
            clause = self.alter("t1")
            tool = subprocess.run(
                ["pt-online-schema-change", "--alter", clause, "--execute",
                 "--recursion-method=none", "--chunk-size=50",
                 f"S={mariadb.socket},u=root,D={FUZZ},t={self.names['t1']}"],
                capture_output=True, text=True, timeout=300)
            assert tool.returncode == 0, tool.stdout + tool.stderr
            with self.conn.cursor() as cur:
                cur.execute(f"SELECT COUNT(*) FROM {self.table('t1')}")
                if cur.fetchone()[0]:
                    self.written.add("_t1_new")  # the copy wrote the helper's topic
            what = f"osc {clause}"
        elif what == "rename":
            new = f"t2_v{self._next()}"
            _run(self.conn, [f"RENAME TABLE {self.table('t2')} TO {FUZZ}.{new}"])
            self.names["t2"] = new
        else:
            _run(self.conn, [f"TRUNCATE TABLE {self.table(role)}"])
            self.written.add(self.names[role])  # a truncate event on the table's topic
        return f"{role} {what}"


@pytest.mark.long
@pytest.mark.parametrize("seed", range(1, 7))
def test_seeded_schema_and_row_changes_keep_replicas_equal(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, debezium_fence: DebeziumFence,
    pipeline_config: PipelineConfig,
    spark, seed: int,
) -> None:
    import random

    pipeline = _config(pipeline_config, [PREFIX, rf"^{PREFIX}\.{FUZZ}\..*"],
                  [{"source": f"{FUZZ}.t1", "replica": "r1"},
                   {"source": rf"{FUZZ}\.t2(_v\d+)?", "replica": "r2"}])
    conn = mariadb.connect()
    _run(conn, [f"DROP DATABASE IF EXISTS {FUZZ}", f"CREATE DATABASE {FUZZ}",
                *(f"CREATE TABLE {FUZZ}.{t} (id INT PRIMARY KEY, a INT, b VARCHAR(20))"
                  for t in ("t1", "t2"))])
    work = _Workload(conn, random.Random(seed))
    work.rows("t1")
    work.rows("t2")
    builder = ReplicaBuilder(spark, pipeline)
    done: list[str] = []

    def check() -> None:
        _consume(pipeline, debezium_fence, [f"{FUZZ}.{t}" for t in sorted(work.written)])
        for replica, role in (("r1", "t1"), ("r2", "t2")):
            builder.apply(replica)
            try:
                _assert_equal(conn, spark, pipeline, replica, work.table(role))
            except AssertionError as e:
                raise AssertionError(f"seed {seed} after {done}") from e

    for _ in range(4):
        done += [work.step(mariadb) for _ in range(work.rng.randint(2, 5))]
        check()
    for replica, role in (("r1", "t1"), ("r2", "t2")):
        builder.rebuild(replica)
        _assert_equal(conn, spark, pipeline, replica, work.table(role))
