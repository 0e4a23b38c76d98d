"""The demo's source database: a small shop in MariaDB, its workloads, and the comparison.

`shop.customers` and `shop.products` are plain tables; orders are sharded into two
databases (`shop_1.orders`, `shop_2.orders`, with overlapping ids) and gathered into one
`orders` replica. `demo_workload` runs a fixed story (inserts, updates, deletes, a
primary-key change, an added column, a truncate); `random_workload` a seeded random mix
for the end-to-end test. `compare` reads each source table and its replica's live rows
and reports whether their content is equal.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable
    
    from pymysql.connections import Connection
    from pyspark.sql import DataFrame, SparkSession

SHARDS = ("shop_1", "shop_2")

SCHEMA = [
    "CREATE DATABASE IF NOT EXISTS shop",
    *(f"CREATE DATABASE IF NOT EXISTS {s}" for s in SHARDS),
    """CREATE TABLE IF NOT EXISTS shop.customers (
        id INT PRIMARY KEY, name VARCHAR(100) NOT NULL, email VARCHAR(200))""",
    """CREATE TABLE IF NOT EXISTS shop.products (
        id INT PRIMARY KEY, name VARCHAR(100) NOT NULL, price DECIMAL(10,2) NOT NULL,
        weight DOUBLE)""",
    *(f"""CREATE TABLE IF NOT EXISTS {s}.orders (
        id INT PRIMARY KEY, customer_id INT NOT NULL, product_id INT NOT NULL,
        quantity INT NOT NULL, status VARCHAR(20) NOT NULL, created_at DATETIME(3))"""
      for s in SHARDS),
]

# (source tables, columns compared)
Spec = tuple[tuple[str, ...], tuple[str, ...]]

# replica -> its spec
REPLICAS: dict[str, Spec] = {
    "customers": (("shop.customers",), ("id", "name", "email", "tier")),
    "products": (("shop.products",), ("id", "name", "price", "weight")),
    "orders": (tuple(f"{s}.orders" for s in SHARDS),
               ("id", "customer_id", "product_id", "quantity", "status", "created_at")),
}

T0 = datetime(2026, 11, 1, 9, 0, 0)


def create_schema(conn: Connection) -> None:
    with conn.cursor() as cur:
        for stmt in SCHEMA:
            cur.execute(stmt)


def _run(conn: Connection, statements: list[tuple[str, tuple]]) -> None:
    with conn.cursor() as cur:
        for sql, args in statements:
            cur.execute(sql, args)


def demo_workload(conn: Connection) -> int:
    """The fixed demo story; returns the number of statements run."""
    stmts: list[tuple[str, tuple]] = []
    for i, name in enumerate(["Ada", "Grace", "Edsger", "Barbara", "Ken"], start=1):
        stmts.append(("INSERT INTO shop.customers (id, name, email) VALUES (%s, %s, %s)",
                      (i, name, f"{name.lower()}@example.com")))
    for i, (name, price, weight) in enumerate(
        [("scooter", "199.90", 3.14), ("battery", "89.50", 8.1), ("drill", "45.00", 0.8),
         ("hammer", "12.25", 0.75)], start=1):
        stmts.append(("INSERT INTO shop.products VALUES (%s, %s, %s, %s)",
                      (i, name, Decimal(price), weight)))
    for shard, n in (("shop_1", 6), ("shop_2", 5)):
        for i in range(1, n + 1):
            stmts.append((f"INSERT INTO {shard}.orders VALUES (%s, %s, %s, %s, %s, %s)",
                          (i, 1 + i % 5, 1 + i % 4, i, "new", T0 + timedelta(minutes=i))))
    stmts += [
        ("UPDATE shop.customers SET email = %s WHERE id = %s", ("grace@navy.mil", 2)),
        ("UPDATE shop.products SET price = %s WHERE id = %s", (Decimal("179.00"), 1)),
        ("UPDATE shop_1.orders SET status = %s WHERE id IN (1, 2)", ("shipped",)),
        ("UPDATE shop_2.orders SET status = %s WHERE id = %s", ("cancelled", 4)),
        ("DELETE FROM shop.customers WHERE id = %s", (5,)),
        ("DELETE FROM shop_1.orders WHERE id = %s", (3,)),
        # A primary-key change: Debezium emits a delete of 3 and a create of 40.
        ("UPDATE shop.products SET id = %s WHERE id = %s", (40, 3)),
        # An added column: later rows carry it, older rows stay NULL in source and replica.
        ("ALTER TABLE shop.customers ADD COLUMN tier VARCHAR(20) NULL", ()),
        ("UPDATE shop.customers SET tier = %s WHERE id = %s", ("gold", 1)),
        ("INSERT INTO shop.customers VALUES (%s, %s, %s, %s)",
         (6, "Linus", "linus@example.com", "basic")),
        ("TRUNCATE TABLE shop_2.orders", ()),
        ("INSERT INTO shop_2.orders VALUES (%s, %s, %s, %s, %s, %s)",
         (10, 2, 1, 3, "new", T0 + timedelta(hours=2))),
        ("INSERT INTO shop_2.orders VALUES (%s, %s, %s, %s, %s, %s)",
         (11, 3, 40, 1, "new", T0 + timedelta(hours=3))),
    ]
    # The demo adds `tier` on every run; a rerun against an existing database must not.
    with conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM information_schema.columns WHERE "
                    "table_schema='shop' AND table_name='customers' AND column_name='tier'")
        if cur.fetchone()[0]:
            stmts = [s for s in stmts if not s[0].startswith("ALTER")]
    _run(conn, stmts)
    return len(stmts)


def random_workload(conn: Connection, seed: int, statements: int) -> int:
    """A seeded random mix of inserts, updates, deletes, re-inserts, key changes and
    (rarely) truncates over every demo table; returns the statements run."""
    rng = random.Random(seed)
    live: dict[str, set[int]] = {"shop.customers": set(), "shop.products": set(),
                                 **{f"{s}.orders": set() for s in SHARDS}}
    with conn.cursor() as cur:
        for table in live:
            cur.execute(f"SELECT id FROM {table}")
            live[table] = {r[0] for r in cur.fetchall()}
    stmts: list[tuple[str, tuple]] = []
    for _ in range(statements):
        table = rng.choice(list(live))
        ids = live[table]
        roll = rng.random()
        if roll < 0.45 or not ids:
            new = rng.randint(1, 60)
            if new in ids:
                continue
            ids.add(new)
            stmts.append(_insert(table, new, rng))
        elif roll < 0.75:
            stmts.append(_update(table, rng.choice(sorted(ids)), rng))
        elif roll < 0.92:
            victim = rng.choice(sorted(ids))
            ids.discard(victim)
            stmts.append((f"DELETE FROM {table} WHERE id = %s", (victim,)))
        elif roll < 0.99:
            old, new = rng.choice(sorted(ids)), rng.randint(61, 200)
            if new in ids:
                continue
            ids.discard(old)
            ids.add(new)
            stmts.append((f"UPDATE {table} SET id = %s WHERE id = %s", (new, old)))
        else:
            ids.clear()
            stmts.append((f"TRUNCATE TABLE {table}", ()))
    _run(conn, stmts)
    return len(stmts)


def _insert(table: str, key: int, rng: random.Random) -> tuple[str, tuple]:
    if table == "shop.customers":
        return ("INSERT INTO shop.customers (id, name, email) VALUES (%s, %s, %s)",
                (key, f"c{key}", f"c{key}-{rng.randint(0, 999)}@example.com"))
    if table == "shop.products":
        return ("INSERT INTO shop.products VALUES (%s, %s, %s, %s)",
                (key, f"p{key}", Decimal(rng.randint(100, 99999)) / 100,
                 rng.choice([None, rng.random() * 10])))
    return (f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s, %s)",
            (key, rng.randint(1, 60), rng.randint(1, 60), rng.randint(1, 9), "new",
             T0 + timedelta(seconds=rng.randint(0, 10**6), milliseconds=rng.randint(0, 999))))


def _update(table: str, key: int, rng: random.Random) -> tuple[str, tuple]:
    if table == "shop.customers":
        return ("UPDATE shop.customers SET email = %s WHERE id = %s",
                (f"u{rng.randint(0, 9999)}@example.com", key))
    if table == "shop.products":
        return ("UPDATE shop.products SET price = %s WHERE id = %s",
                (Decimal(rng.randint(100, 99999)) / 100, key))
    return (f"UPDATE {table} SET status = %s, quantity = quantity + 1 WHERE id = %s",
            (rng.choice(["paid", "shipped", "cancelled"]), key))


@dataclass(frozen=True)
class TableComparison:
    replica: str
    source_rows: int
    replica_rows: int
    mismatched: int  # rows present on one side only, or with different values

    @property
    def matches(self) -> bool:
        return self.mismatched == 0 and self.source_rows == self.replica_rows


def _norm(value: Any) -> Any:
    if isinstance(value, Decimal):
        return format(value.normalize(), "f")
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, datetime):
        return value.replace(tzinfo=None).isoformat(timespec="milliseconds")
    return value


def source_rows(conn: Connection, replica: str, spec: Spec | None = None) -> set[tuple]:
    """The replica's source tables as (shard db or None, compared columns...) rows; a
    column the table does not have (yet) reads as NULL, as in the replica. `spec` (source
    tables, compared columns) describes a replica that is not one of the shop's."""
    tables, columns = spec or REPLICAS[replica]
    out: set[tuple] = set()
    with conn.cursor() as cur:
        for table in tables:
            cur.execute(f"SELECT * FROM {table} LIMIT 0")
            present = [d[0] for d in cur.description]
            cols = [c for c in columns if c in present]
            cur.execute(f"SELECT {', '.join(cols)} FROM {table}")
            db = table.split(".")[0] if len(tables) > 1 else None
            for row in cur.fetchall():
                values = dict(zip(cols, row, strict=True))
                out.add((db, *(_norm(values.get(c)) for c in columns)))
    return out


def replica_rows(spark: SparkSession, database: str, replica: str,
                 frame: DataFrame | None = None, spec: Spec | None = None
                 ) -> set[tuple]:
    """The replica's live rows; `frame` instead of the catalog's `<replica>_current` view
    when given (say, the live rows of a replica read by path from another lakehouse);
    `spec` as for `source_rows`."""
    tables, columns = spec or REPLICAS[replica]
    df = frame if frame is not None else spark.table(f"`{database}`.`{replica}_current`")
    present = set(df.columns)
    sharded = len(tables) > 1
    out: set[tuple] = set()
    for row in df.collect():
        d = row.asDict()
        db = d["_source_db"] if sharded else None
        out.add((db, *(_norm(d.get(c)) if c in present else None for c in columns)))
    return out


def compare(conn: Connection, spark: SparkSession, database: str,
            read: Callable[[str], DataFrame] | None = None) -> list[TableComparison]:
    """Per replica, its source tables against its live rows; `read(replica)` returns the
    live rows as a DataFrame when the replica is not in `spark`'s catalog."""
    results = []
    for replica in REPLICAS:
        src = source_rows(conn, replica)
        rep = replica_rows(spark, database, replica, None if read is None else read(replica))
        results.append(TableComparison(replica, len(src), len(rep), len(src ^ rep)))
    return results


def compare_cache(conn: Connection, cached: dict[str, dict[str, str]]) -> TableComparison:
    """`shop.customers` against the handler example's Redis rows (key -> column -> text,
    NULL columns absent), value for value."""
    from binlog_assets.examples.customer_cache import cell_text

    with conn.cursor() as cur:
        cur.execute("SELECT * FROM shop.customers")
        names = [d[0] for d in cur.description]
        source = {str(row[0]): {c: cell_text(v) for c, v in zip(names, row, strict=True)
                                if v is not None} for row in cur.fetchall()}
    mismatched = sum(source.get(k) != cached.get(k) for k in source.keys() | cached.keys())
    return TableComparison("customers cache", len(source), len(cached), mismatched)
