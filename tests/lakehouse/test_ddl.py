"""Reading renames and drops out of DDL text (`lakehouse/ddl.py`), without Spark."""

import pytest

from binlog_assets.lakehouse.ddl import (
    ColumnAdd,
    DdlEvent,
    column_adds,
    column_renames,
    plan_ddl,
    table_renames,
)


@pytest.mark.parametrize(("ddl", "expected"), [
    ("ALTER TABLE t RENAME COLUMN old_name TO new_name", [("old_name", "new_name")]),
    ("alter table `t` rename column `a b` to `c``d`", [("a b", "c`d")]),
    ("ALTER TABLE t CHANGE COLUMN a b VARCHAR(20)", [("a", "b")]),
    ("ALTER TABLE t CHANGE a a BIGINT", []),  # a type change, not a rename
    ("ALTER TABLE t CHANGE IF EXISTS a B INT, RENAME COLUMN c TO d",
     [("a", "B"), ("c", "d")]),
    ("ALTER TABLE t MODIFY qty BIGINT, DROP COLUMN note", []),
])
def test_column_renames(ddl, expected):
    assert column_renames(ddl) == expected


@pytest.mark.parametrize(("ddl", "expected"), [
    ("RENAME TABLE probe.items TO probe.items_v2", [("probe.items", "probe.items_v2")]),
    ("RENAME TABLE a TO b, `x`.`c` TO `y`.d", [("db.a", "db.b"), ("x.c", "y.d")]),
    ("ALTER TABLE items RENAME TO items_v2", [("db.items", "db.items_v2")]),
    ("ALTER TABLE items RENAME AS other.items", [("db.items", "other.items")]),
    ("ALTER TABLE items RENAME COLUMN a TO b", []),
    ("ALTER TABLE items RENAME INDEX a TO b", []),
    ("DROP TABLE items", []),
])
def test_table_renames(ddl, expected):
    assert table_renames(ddl, "db") == expected


@pytest.mark.parametrize(("ddl", "expected"), [
    ("ALTER TABLE shop.customers ADD COLUMN tier VARCHAR(20) NULL", [ColumnAdd("tier", None)]),
    ("alter table `t` add `c` int not null default 5 after id, ADD INDEX i (c), "
     "add column d decimal(10,2) default '1.50' comment 'x, default 9'",
     [ColumnAdd("c", "5"), ColumnAdd("d", "'1.50'")]),
    ("ALTER TABLE t ADD COLUMN IF NOT EXISTS e VARCHAR(5) NOT NULL", [ColumnAdd("e", "''")]),
    ("ALTER TABLE t ADD n BIGINT NOT NULL FIRST", [ColumnAdd("n", "0")]),
    ("ALTER TABLE t ADD d DATE NOT NULL", [ColumnAdd("d", None, known=False)]),
    ("ALTER TABLE t ADD ts TIMESTAMP DEFAULT CURRENT_TIMESTAMP, ADD PRIMARY KEY (id)",
     [ColumnAdd("ts", None, known=False, now=True)]),
    # The statement's time only for a TIMESTAMP in whole seconds: a DATETIME's is the
    # session's wall clock, and the binlog's time has no fraction.
    ("ALTER TABLE t ADD a timestamp not null default now() on update current_timestamp, "
     "ADD b TIMESTAMP(0) DEFAULT CURRENT_TIMESTAMP(0), ADD c DATETIME DEFAULT NOW(), "
     "ADD d TIMESTAMP(6) DEFAULT CURRENT_TIMESTAMP(6), ADD e TIMESTAMP DEFAULT uuid(), "
     "ADD f TIMESTAMP DEFAULT",
     [ColumnAdd("a", None, known=False, now=True), ColumnAdd("b", None, known=False, now=True),
      ColumnAdd("c", None, known=False), ColumnAdd("d", None, known=False),
      ColumnAdd("e", None, known=False), ColumnAdd("f", None, known=False)]),
    ("ALTER TABLE t ADD COLUMN s VARCHAR(9) DEFAULT 'it''s \\\\ ok'",
     [ColumnAdd("s", "'it\\'s \\\\ ok'")]),
    ("ALTER TABLE t ADD COLUMN x INT DEFAULT -3, ADD CONSTRAINT c CHECK (x > 0)",
     [ColumnAdd("x", "-3")]),
    ("ALTER TABLE t ADD UNIQUE KEY u (a), ADD FOREIGN KEY (b) REFERENCES o (id)", []),
    ("ALTER TABLE t DROP COLUMN c", []),
    ("CREATE TABLE x (a INT NOT NULL DEFAULT 1)", []),
    # The parenthesised form adds each column of its list.
    ("ALTER TABLE t ADD (a INT NOT NULL DEFAULT 3, `b c` VARCHAR(9) DEFAULT 'x,(y)', "
     "d DECIMAL(10,2) NOT NULL)",
     [ColumnAdd("a", "3"), ColumnAdd("b c", "'x,(y)'"), ColumnAdd("d", "0")]),
    ("alter table t add column if not exists (e int null), add f bigint default 2",
     [ColumnAdd("e", None), ColumnAdd("f", "2")]),
    ("ALTER TABLE t ADD INDEX (a, b), ADD PRIMARY KEY (id)", []),
])
def test_column_adds(ddl, expected):
    assert column_adds(ddl) == expected


def test_the_latest_add_of_a_column_is_planned():
    plan = plan_ddl([
        _event("db.items", 10, "ALTER TABLE items ADD COLUMN c INT DEFAULT 1", {"c": "int"}),
        _event("db.items", 20, "ALTER TABLE items DROP COLUMN c", {"id": "int"}),
        _event("db.items", 30, "ALTER TABLE items ADD COLUMN C INT", {"C": "int"}),
        _event("db.other", 40, "ALTER TABLE other ADD COLUMN c INT", {"c": "int"}),
    ], {"db.items"}.__contains__)
    assert plan.column_adds == {("db.items", "c"): ((1, 7, 30, 0, 0, 0), ColumnAdd("C", None))}


def test_a_timestamp_added_with_the_current_time_holds_the_statements_time():
    plan = plan_ddl([
        _event("db.items", 10, "ALTER TABLE items ADD COLUMN at TIMESTAMP "
               "DEFAULT CURRENT_TIMESTAMP", {"at": "timestamp"}, source_ts=1795000123456),
        _event("db.items", 20, "ALTER TABLE items ADD COLUMN local DATETIME DEFAULT NOW()",
               {"local": "timestamp"}, source_ts=1795000124000),
        _event("db.items", 30, "ALTER TABLE items ADD COLUMN unknown TIMESTAMP "
               "DEFAULT CURRENT_TIMESTAMP", {"unknown": "timestamp"}),
    ], {"db.items"}.__contains__)
    assert plan.column_adds == {
        ("db.items", "at"): ((1, 7, 10, 0, 0, 0),
                             ColumnAdd("at", "TIMESTAMP '2026-11-18 11:08:43'")),
        ("db.items", "local"): ((1, 7, 20, 0, 0, 0), ColumnAdd("local", None, known=False)),
        ("db.items", "unknown"): ((1, 7, 30, 0, 0, 0),
                                  ColumnAdd("unknown", None, known=False, now=True)),
    }


def _event(table, pos, ddl, columns=None, source_ts=None):
    return DdlEvent(table, (1, 7, pos, 0, 0, 0), ddl, columns, source_ts)


def test_plan_follows_binlog_order_and_routing():
    routed = {"db.items", "db.items_v2", "db.other"}.__contains__
    plan = plan_ddl([
        _event("db.items", 30, "ALTER TABLE items RENAME COLUMN a TO b",
               {"id": "int", "b": "int"}),
        _event("db.items", 20, "ALTER TABLE items DROP COLUMN note", {"id": "int", "a": "int"}),
        _event("db.items_v2", 40, "RENAME TABLE items TO items_v2", {"id": "int", "b": "int"}),
        _event("db.gone", 50, "DROP TABLE gone"),  # not routed here
        _event("db.other", 60, "DROP TABLE `db`.`other`"),
        _event("db2.*", 70, "DROP DATABASE db2"),
        _event("db.unrouted", 80, "ALTER TABLE unrouted RENAME COLUMN x TO y", {"y": "int"}),
    ], routed)
    assert plan.column_renames == [("db.items", "a", "b", (1, 7, 30, 0, 0, 0))]
    assert plan.definitions == {"db.items": ((1, 7, 30, 0, 0, 0), ["id", "b"]),
                                "db.items_v2": ((1, 7, 40, 0, 0, 0), ["id", "b"])}
    assert plan.table_renames == [("db.items", "db.items_v2", (1, 7, 40, 0, 0, 0))]
    assert plan.drops == {"db.other": (1, 7, 60, 0, 0, 0), "db2.*": (1, 7, 70, 0, 0, 0)}


# -- the replica's record of its source tables, and the column plan (no Spark session) --

P = (1, 7, 0, 0, 0, 0)


def _pos(n):
    return (1, 7, n, 0, 0, 0)


def _route(mode="evolve", source=r"db\.t\d"):
    from binlog_assets.config import parse_config
    from binlog_assets.lakehouse.replica.routes import replica_route

    pipeline = parse_config({"sources": [{"name": "s", "topics": ["x"], "tables": [
        {"source": source, "replica": "r", "schema_evolution": mode}]}]})
    return replica_route(pipeline, "r")


def _survey(tables, declared=(), table_columns=None):
    from pyspark.sql import types as T

    from binlog_assets.lakehouse.replica.plan import Survey

    survey = Survey(list(tables), 0, None, {c: T.StringType() for c in declared}, {}, set(),
                    {})
    survey.table_columns = table_columns or {}
    return survey


def test_a_row_image_older_than_a_drop_never_brings_the_column_back():
    from binlog_assets.lakehouse.replica.ddl_apply import (
        SOURCES_PROPERTY,
        drop_stale,
        track_sources,
    )

    # Stored: db.t1 dropped `note` at position 20. A late batch of rows from position 15
    # (before the drop) still declares it.
    props = {SOURCES_PROPERTY: '{"db.t1": [[1, 7, 20, 0, 0, 0], ["id", "qty"]]}'}
    survey = _survey(["db.t1"], ["id", "qty", "note"],
                     {"db.t1": (_pos(15), ["id", "qty", "note"])})
    sources = track_sources(props, survey, plan_ddl([], _route().matches), _route(), [])
    assert not sources.changed
    drop_stale(survey, sources)
    assert sorted(survey.declared) == ["id", "qty"]


def test_columns_drop_only_when_no_source_table_has_them_and_all_are_known():
    from pyspark.sql import types as T

    from binlog_assets.lakehouse.replica.ddl_apply import plan_columns, track_sources

    current = {"id": T.IntegerType(), "qty": T.IntegerType(), "note": T.StringType()}
    ddl = plan_ddl([_event("db.t1", 30, "ALTER TABLE t1 DROP COLUMN note",
                           {"id": "int", "qty": "int"})], _route().matches)
    # Shard t2 still has `note`: it stays.
    both = track_sources({}, _survey(["db.t1"]), ddl, _route(), ["db.t1", "db.t2"])
    assert both.columns(["db.t1"]) is None  # t2's columns are not known yet
    stored = '{"db.t2": [[1, 7, 5, 0, 0, 0], ["id", "qty", "note"]]}'
    from binlog_assets.lakehouse.replica.ddl_apply import SOURCES_PROPERTY

    known = track_sources({SOURCES_PROPERTY: stored}, _survey(["db.t1"]), ddl, _route(), [])
    assert plan_columns(current, ddl, known, _survey(["db.t1"]), ["id"], _route()).drops == []
    # Once t2 drops it too, the replica drops it.
    ddl2 = plan_ddl([_event("db.t2", 40, "ALTER TABLE t2 DROP COLUMN note",
                            {"id": "int", "qty": "int"})], _route().matches)
    after = track_sources({SOURCES_PROPERTY: known.property_value()}, _survey(["db.t2"]),
                          ddl2, _route(), [])
    assert plan_columns(current, ddl2, after, _survey(["db.t2"]), ["id"],
                        _route()).drops == ["note"]


def test_renames_chain_and_follow_the_mode():
    from pyspark.sql import types as T

    from binlog_assets.lakehouse.replica.ddl_apply import plan_columns, track_sources
    from binlog_assets.lakehouse.schema import SchemaEvolutionError

    current = {"id": T.IntegerType(), "a": T.StringType(), "c": T.StringType()}
    events = [_event("db.t1", 10, "ALTER TABLE t1 RENAME COLUMN a TO b",
                     {"id": "int", "b": "string"}),
              _event("db.t1", 20, "ALTER TABLE t1 CHANGE b c VARCHAR(9)",
                     {"id": "int", "c": "string"})]
    ddl = plan_ddl(events, _route().matches)
    survey = _survey(["db.t1"])
    sources = track_sources({}, survey, ddl, _route(), [])
    plan = plan_columns(current, ddl, sources, survey, ["id"], _route())
    assert plan.renames == [("db.t1", [("a", _pos(10)), ("b", _pos(20))], "c")]
    assert plan.describe() == ["rename column a -> b (db.t1)", "rename column b -> c (db.t1)",
                               "drop column a"]
    assert survey.aliases == {"c": ["b", "a"]}  # older images: the newest name first
    with pytest.raises(SchemaEvolutionError, match=r"'r'.*rename column a -> b"):
        plan_columns(current, ddl, sources, _survey(["db.t1"]), ["id"], _route("exception"))
    ignored = plan_columns(current, ddl, sources, _survey(["db.t1"]), ["id"], _route("ignore"))
    assert (ignored.renames, ignored.drops) == ([], [])


def test_drops_and_renames_of_tables():
    from binlog_assets.lakehouse.replica.ddl_apply import track_sources

    route = _route(source=r"db\.(t\d|kept)")
    stored = {"db.t1": [[], ["id"]], "db.t2": [[], ["id"]], "db.kept": [[], ["id"]],
              "other.t1": [[], ["id"]]}
    import json

    from binlog_assets.lakehouse.replica.ddl_apply import SOURCES_PROPERTY

    ddl = plan_ddl([_event("db.t9", 10, "RENAME TABLE t1 TO t9", {"id": "int"}),
                    _event("db.gone", 20, "RENAME TABLE t2 TO gone", {"id": "int"}),
                    _event("db.*", 30, "DROP DATABASE db")], route.matches)
    sources = track_sources({SOURCES_PROPERTY: json.dumps(stored)}, _survey([]), ddl, route, [])
    # t1 -> t9 stays in the replica (moved); t2 -> gone leaves it; the database drop
    # takes what is left of `db` (t9 too: it was renamed before the drop).
    assert [t for t, _ in sources.dropped] == ["db.t2", "db.kept", "db.t9"]
    assert set(sources.known) == {"other.t1"}
    assert any("renamed to db.gone" in n for n in sources.notes)


def test_a_table_created_again_after_its_drop_keeps_its_new_definition():
    from binlog_assets.lakehouse.replica.ddl_apply import track_sources

    route = _route()
    ddl = plan_ddl([_event("db.t1", 10, "DROP TABLE t1"),
                    _event("db.t1", 20, "CREATE TABLE t1 (id INT PRIMARY KEY)", {"id": "int"})],
                   route.matches)
    sources = track_sources({}, _survey(["db.t1"]), ddl, route, ["db.t1"])
    assert sources.dropped == [("db.t1", _pos(10))]  # the old rows go
    assert sources.known == {"db.t1": (_pos(20), ["id"])}  # the new table stays known


def test_partition_maintenance_that_removes_rows_unlogged_is_noted():
    from binlog_assets.lakehouse.replica.ddl_apply import track_sources

    route = _route()
    ddl = plan_ddl([
        _event("db.t1", 10, "ALTER TABLE t1 DROP PARTITION p2019, p2020", {"id": "int"}),
        _event("db.t1", 20, "alter table `t1` truncate partition `p2021`", {"id": "int"}),
        _event("db.t2", 30, "ALTER TABLE t2 EXCHANGE PARTITION p0 WITH TABLE t2_old",
               {"id": "int"}),
        # Rows stay where these go: nothing to say.
        _event("db.t1", 40, "ALTER TABLE t1 REORGANIZE PARTITION pmax INTO (PARTITION "
               "p2022 VALUES LESS THAN (2023), PARTITION pmax VALUES LESS THAN MAXVALUE)",
               {"id": "int"}),
        _event("db.t1", 50, "ALTER TABLE t1 ADD PARTITION (PARTITION p9 VALUES LESS THAN "
               "(9))", {"id": "int"}),
        _event("db.other", 60, "ALTER TABLE other DROP PARTITION p0", {"id": "int"}),
    ], route.matches)
    assert ddl  # the apply looks at it
    assert [(t, c) for t, c, _ in ddl.partition_rows] == [
        ("db.t1", "DROP PARTITION p2019, p2020"), ("db.t1", "TRUNCATE PARTITION `p2021`"),
        ("db.t2", "EXCHANGE PARTITION p0")]
    notes = track_sources({}, _survey(["db.t1", "db.t2"]), ddl, route, []).notes
    assert notes[0] == (
        "DROP PARTITION p2019, p2020 on db.t1: the source's rows of the partition changed "
        "with no row events in the binlog, so the replica still holds them as they were "
        "(re-snapshot db.t1 to bring it level)")
    assert len(notes) == 3


def test_a_table_renamed_within_the_replica_and_created_again_keeps_both():
    from binlog_assets.lakehouse.replica.ddl_apply import track_sources

    route = _route(source=r"db\.t\d")
    ddl = plan_ddl([_event("db.t2", 10, "RENAME TABLE t1 TO t2", {"id": "int", "a": "int"}),
                    _event("db.t1", 20, "CREATE TABLE t1 (id INT PRIMARY KEY, b INT)",
                           {"id": "int", "b": "int"})], route.matches)
    sources = track_sources({}, _survey(["db.t1", "db.t2"]), ddl, route, [])
    assert sources.known == {"db.t1": (_pos(20), ["id", "b"]),
                             "db.t2": (_pos(10), ["id", "a"])}


def test_columns_of_a_batch_with_a_table_renamed_away_are_known():
    from binlog_assets.lakehouse.replica.ddl_apply import track_sources

    # Rows of t1 in the batch, then t1 -> t2 and a column of t2 dropped: the record
    # knows every table still there, so the drop can be planned.
    route = _route(source=r"db\.t\d")
    ddl = plan_ddl([_event("db.t2", 10, "RENAME TABLE t1 TO t2", {"id": "int", "a": "int"}),
                    _event("db.t2", 20, "ALTER TABLE t2 DROP COLUMN a", {"id": "int"})],
                   route.matches)
    survey = _survey(["db.t1"], table_columns={"db.t1": (_pos(5), ["id", "a"])})
    sources = track_sources({}, survey, ddl, route, [])
    assert sources.columns(survey.tables) == {"id"}
