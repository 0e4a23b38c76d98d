"""An online schema change's cut-over on real Spark + Delta: the helper table the tool
built is renamed into the replicated name (`RENAME TABLE orders TO _orders_old,
_orders_new TO orders`), and the replica takes the helper's rows and columns.
(The same with the real pt-online-schema-change, MariaDB and Debezium:
tests/drills/test_e2e_online_schema_change.py.)"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest
from lake_events import TYPES, MakeConfig, Partition, Source, row

from binlog_assets.formats.event import ChangeEvent
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder

# The ALTER the tool ran on its helper: `note` dropped, `tag` added with a default.
HELPER_TYPES = {"id": "bigint", "amount": "decimal(10,2)", "qty": "int", "tag": "string"}
SWAP = "RENAME TABLE `orders` TO `_orders_old`, `_orders_new` TO `orders`"


def helper_row(id_: int, amount: str, tag: str = "std") -> dict:
    return {"id": id_, "amount": Decimal(amount), "qty": 1, "tag": tag}


def as_table(src: Source, table: str, types: dict[str, str]) -> Source:
    """`src`, now writing `table` (one binlog cursor for every table, as in MySQL)."""
    src.table, src.types = table, dict(types)
    return src


def ddl(src: Source, table: str, text: str, types: dict[str, str]) -> ChangeEvent:
    return ChangeEvent(table, "ddl", (), ("id",), None, None, src._next(), 1_700_000_000_000,
                       ddl=text, column_types=dict(types))


def live(spark, pipeline, columns: tuple[str, ...]) -> dict:
    rows = spark.table(f"{pipeline.lakehouse.database}.orders_current").collect()
    return {r["id"]: tuple(r[c] for c in columns) for r in rows}


def online_schema_change(src: Source) -> tuple[list, list, list]:
    """pt-online-schema-change's records after three rows were inserted: (up to and with
    the swap, the helper's changes among them a late consumer may get after the swap,
    after the swap). Writes to `orders` during the copy reach the helper through
    triggers; one row is deleted on both."""
    before = [[as_table(src, "shop._orders_new", HELPER_TYPES) and ddl(
        src, "shop._orders_new", "CREATE TABLE `_orders_new` (...)", HELPER_TYPES)]]
    before += [[src.insert(helper_row(i, f"{i}.00"))] for i in (1, 2, 3)]
    as_table(src, "shop.orders", TYPES)
    before.append(src.update(row(2, "2.00", "b"), row(2, "2.50", "b")))
    as_table(src, "shop._orders_new", HELPER_TYPES)
    late = [src.update(helper_row(2, "2.00"), helper_row(2, "2.50"))]
    as_table(src, "shop.orders", TYPES)
    before.append([src.delete(row(3, "3.00", "c"))])
    as_table(src, "shop._orders_new", HELPER_TYPES)
    late.append([src.delete(helper_row(3, "3.00"))])
    swap = ddl(src, "shop.orders", SWAP, HELPER_TYPES)
    before.append([swap, replace(swap, table="shop._orders_old", column_types=dict(TYPES))])
    as_table(src, "shop.orders", HELPER_TYPES)
    after = [[src.insert(helper_row(4, "4.00"))],
             src.update(helper_row(1, "1.00"), helper_row(1, "1.00", "vip")),
             [ddl(src, "shop._orders_old", "DROP TABLE `_orders_old`", TYPES)]]
    return before, late, after


def setup(spark, make: MakeConfig) -> tuple:
    pipeline = make([{"source": "shop.orders", "replica": "orders"}])
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = Source("shop.orders")
    part.write(part.records([[src.insert(row(i, f"{i}.00", "abc"[i - 1]))] for i in (1, 2, 3)]))
    builder.apply("orders")
    return pipeline, part, builder, src


SWAPPED = {1: (Decimal("1.00"), "vip"), 2: (Decimal("2.50"), "std"), 4: (Decimal("4.00"), "std")}


@pytest.mark.parametrize("split", [False, True], ids=["one-apply", "swap-then-later"])
def test_a_swapped_in_helper_becomes_the_replica(spark, make_config_each_path: MakeConfig,
                                                 split: bool) -> None:
    pipeline, part, builder, src = setup(spark, make_config_each_path)
    first, late, then = online_schema_change(src)
    before = part.records(first[:-1] + late + first[-1:])
    after = part.records(then)
    part.write(before, end_offset=before[-1].offset + 1)
    if split:
        swapped = builder.apply("orders")
        assert live(spark, pipeline, ("amount", "tag")) == {
            1: (Decimal("1.00"), "std"), 2: (Decimal("2.50"), "std")}
        part.write(after)
        later = builder.apply("orders")
        assert later.schema_changes == (), later
    else:
        part.write(after)
        swapped = builder.apply("orders")
    assert ("table shop._orders_new renamed to shop.orders: the replica's rows of shop.orders "
            "are shop._orders_new's as of the rename (5 changes read)"
            ) in swapped.schema_changes, swapped
    assert "drop column note" in swapped.schema_changes, swapped
    # The swap is not a drop of `orders`, and there is nothing to re-snapshot.
    assert not [c for c in swapped.schema_changes if "drop table" in c or "re-snapshot" in c]
    columns = spark.table(f"{pipeline.lakehouse.database}.orders_current").columns
    assert [c for c in columns if not c.startswith("_")] == ["id", "amount", "qty", "tag"]
    assert live(spark, pipeline, ("amount", "tag")) == SWAPPED
    again = builder.apply("orders")
    assert again.skipped
    # A change of `orders` from before the swap, arriving late, stays out.
    as_table(src, "shop.orders", TYPES)
    late = row(9, "9.00", "late")
    part.write(part.records([[ChangeEvent("shop.orders", "c", (9,), ("id",), None, late,
                                          before[1].position, 1_700_000_000_000,
                                          column_types=dict(TYPES))]]))
    assert builder.apply("orders").written == 0
    assert 9 not in live(spark, pipeline, ("amount",))


def test_a_swap_without_the_helper_in_the_changelog_says_to_resnapshot(
        spark, make_config: MakeConfig) -> None:
    # The default on_drop (truncate): the rename of `orders` away is half of the swap,
    # so its rows stay (the closest the replica can be) rather than all leave.
    pipeline = make_config([{"source": "shop.orders", "replica": "orders"}])
    part, builder = Partition(ChangelogWriter(pipeline)), ReplicaBuilder(spark, pipeline)
    src = Source("shop.orders")
    part.write(part.records([[src.insert(row(1))]]))
    builder.apply("orders")
    swap = ddl(src, "shop.orders", SWAP, HELPER_TYPES)
    part.write(part.records([[swap, replace(swap, table="shop._orders_old")]]))
    result = builder.apply("orders")
    assert ("table shop._orders_new renamed to shop.orders: its rows from before the rename "
            "are not in the replica (re-snapshot shop.orders to bring them)"
            ) in result.schema_changes, result
    assert not [c for c in result.schema_changes if "drop table" in c], result
    assert set(live(spark, pipeline, ("amount",))) == {1}


def test_helper_changes_arriving_after_the_swap_are_brought_in(
        spark, make_config_each_path: MakeConfig) -> None:
    """The helper's topic lags the schema-change topic: two of its changes from before
    the rename reach the changelog after the apply that did the swap."""
    pipeline, part, builder, src = setup(spark, make_config_each_path)
    first, late, then = online_schema_change(src)
    helper_topic = Partition(part.writer, partition=1)
    part.write(part.records(first + then))
    swapped = builder.apply("orders")
    assert any(c.endswith("(3 changes read)") for c in swapped.schema_changes), swapped
    assert live(spark, pipeline, ("amount", "tag")) == {
        **SWAPPED, 2: (Decimal("2.00"), "std"), 3: (Decimal("3.00"), "std")}
    helper_topic.write(helper_topic.records(late))
    again = builder.apply("orders")
    assert ("table shop._orders_new renamed to shop.orders: the replica's rows of shop.orders "
            "are shop._orders_new's as of the rename (5 changes read, again for changes of "
            "shop._orders_new that arrived after it)") in again.schema_changes, again
    assert live(spark, pipeline, ("amount", "tag")) == SWAPPED
    # A third generation still yields to the later change of row 1 and replaces the second.
    helper_topic.write(helper_topic.records([[ChangeEvent(
        "shop._orders_new", "u", (1,), ("id",), helper_row(1, "1.00"),
        helper_row(1, "1.10"), late[0][0].position, 1_700_000_000_000,
        column_types=dict(HELPER_TYPES))]]))
    third = builder.apply("orders")
    assert any(c.endswith("arrived after it)") for c in third.schema_changes), third
    assert live(spark, pipeline, ("amount", "tag")) == SWAPPED
    assert builder.apply("orders").skipped
