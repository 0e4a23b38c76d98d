"""Parity check of a 1,000,000-row table end to end, beside a plain `CHECKSUM TABLE`.

A fresh MariaDB (its own data directory, a 512 MiB buffer pool) holds `bench.orders`
with `--rows` rows (default 1,000,000; an OLTP order: int key, two ints, a status, a
DECIMAL(12,2), a DATETIME(3), a nullable VARCHAR), loaded by MariaDB's sequence engine.
The replica is the same rows as binlake's replica table holds them (Arrow types of its
columns, `_op`, `_source_db`, `_source_table`), written by delta-rs into the warehouse
folder of a fresh lakehouse, read from the source beforehand. A fresh broker and a
changelog commit at the binlog's current position stand for a pipeline that has caught
up, so the check's "applied past P" wait runs as in production (Kafka high watermarks,
the changelog's transaction state and surveys, the binlog between).

Timed, in one process, after the set-up: `check_replica` (every chunk summed by the
server in its own consistent snapshot, the wait, the replica read and summed by
delta-rs and Python), then `CHECKSUM TABLE bench.orders` on the same server (three times:
the first read may warm the buffer pool for the second; the median is printed). The
check must pass with every row counted. Printed: the load average at the start and end,
the check's seconds (source, wait, replica) and CHECKSUM TABLE's, and the ratios.

    .venv/bin/python bench/bench_parity.py                  # 1,000,000 rows
    .venv/bin/python bench/bench_parity.py --rows 100000    # quick
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Producer

from binlog_assets.config import parse_config
from binlog_assets.dev.kafka import KafkaBroker, create_topics
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.formats.event import ChangeEvent, Position
from binlog_assets.lakehouse.changelog import ChangelogWriter, PartitionWrite
from binlog_assets.parity.check import check_replica
from binlog_assets.parity.lake import replica_uri

TOPIC = "bench.bench.orders"
TICK_TOPIC = "bench.bench.tick"
USER, PASSWORD = "binlake_check", "bench-pw"
TABLE = """CREATE TABLE bench.orders (
    id INT PRIMARY KEY, customer_id INT NOT NULL, product_id INT NOT NULL,
    status VARCHAR(20) NOT NULL, amount DECIMAL(12,2) NOT NULL, created DATETIME(3),
    note VARCHAR(100) NULL)"""
LOAD = """INSERT INTO bench.orders
    SELECT seq, seq % 50000, seq % 997, ELT(1 + seq % 4, 'new', 'paid', 'shipped', 'done'),
           (seq % 100000) / 100, TIMESTAMP'2026-01-01 00:00:00' + INTERVAL seq SECOND
             + INTERVAL (seq % 1000) * 1000 MICROSECOND,
           IF(seq % 5 = 0, NULL, CONCAT('order note ', seq))
    FROM bench.seq_1_to_{rows}"""


def load_average() -> float:
    return os.getloadavg()[0]


def build_source(server: MariaDBServer, rows: int) -> None:
    with server.connect() as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE bench")
        cur.execute(TABLE)
        cur.execute(LOAD.format(rows=int(rows)))
        cur.execute("CREATE TABLE bench.tick (id INT PRIMARY KEY)")
        cur.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (USER, PASSWORD))
        cur.execute("GRANT SELECT ON bench.* TO %s@'%%'", (USER,))
        cur.execute("GRANT BINLOG MONITOR ON *.* TO %s@'%%'", (USER,))


def build_replica(server: MariaDBServer, uri: str) -> int:
    """The source rows as binlake's replica holds them, written by delta-rs."""
    import pyarrow as pa
    import pymysql
    from deltalake import write_deltalake

    schema = pa.schema([
        ("id", pa.int32()), ("customer_id", pa.int32()), ("product_id", pa.int32()),
        ("status", pa.string()), ("amount", pa.decimal128(12, 2)),
        ("created", pa.timestamp("us", tz="UTC")), ("note", pa.string()),
        ("_source_db", pa.string()), ("_source_table", pa.string()), ("_op", pa.string())])
    written = 0
    conn = server.connect(cursorclass=pymysql.cursors.SSCursor)
    with conn.cursor() as cur:
        cur.execute("SELECT * FROM bench.orders ORDER BY id")
        while batch := cur.fetchmany(200_000):
            columns = list(zip(*batch, strict=True))
            created = [None if v is None else v.replace(tzinfo=UTC) for v in columns[5]]
            n = len(batch)
            values = [*columns[:5], created, columns[6], ["bench"] * n, ["orders"] * n,
                      ["c"] * n]
            table = pa.table([pa.array(v, type=f.type) for v, f in zip(values, schema,
                                                                          strict=True)],
                             schema=schema)
            write_deltalake(uri, table, mode="append")
            written += n
    conn.close()
    return written


def catch_up(server: MariaDBServer, pipeline, broker: KafkaBroker) -> None:
    """A changelog commit at the binlog's current end, as a caught-up pipeline leaves it,
    and the one Kafka record it consumed."""
    with server.connect() as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO bench.tick VALUES (1)")
        cur.execute("SHOW MASTER STATUS")
        name, pos = cur.fetchone()[:2]
    create_topics(broker.bootstrap_servers, [TOPIC, TICK_TOPIC])
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    producer.produce(TICK_TOPIC, b"{}")
    producer.flush(30)
    event = ChangeEvent(table="bench.tick", op="c", key=(1,), key_columns=("id",),
                        before=None, after={"id": 1},
                        position=Position(1, int(name.rsplit(".", 1)[1]), int(pos), 0),
                        source_ts=int(time.time() * 1000), topic=TICK_TOPIC, partition=0,
                        offset=0, column_types={"id": "int"})
    ChangelogWriter(pipeline).write(PartitionWrite(
        [event], None, group_id=pipeline.kafka["group.id"], topic=TICK_TOPIC, partition=0,
        end_offset=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk-rows", type=int, default=10_000)
    args = parser.parse_args()
    began_load = load_average()
    work = Path(tempfile.mkdtemp(prefix="bparity-", dir="/tmp"))
    server = MariaDBServer(work / "db", buffer_pool="512M")
    broker = KafkaBroker(work / "kafka")
    try:
        server.start()
        broker.start()
        t = time.monotonic()
        build_source(server, args.rows)
        loaded = time.monotonic() - t
        pipeline = parse_config({
            "kafka": {"bootstrap.servers": broker.bootstrap_servers, "group.id": "bench"},
            "lakehouse": {"path": str(work / "lake"), "database": "bench"},
            "parity": {"chunk_rows": args.chunk_rows, "wait_seconds": 60},
            "sources": [{"name": "bench", "topics": [TOPIC, TICK_TOPIC],
                         "connection": {"host": "127.0.0.1", "port": server.port,
                                        "user": USER, "password": PASSWORD},
                         "tables": [{"source": "bench.orders", "replica": "orders"}]}]})
        t = time.monotonic()
        replica_rows = build_replica(server, replica_uri(pipeline, "orders"))
        staged = time.monotonic() - t
        catch_up(server, pipeline, broker)
        print(f"set-up: {args.rows:,} rows loaded in {loaded:.1f}s, replica of "
              f"{replica_rows:,} rows written in {staged:.1f}s "
              f"({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)")

        start_load = load_average()
        t = time.monotonic()
        report = check_replica(pipeline, "orders", dict(pipeline.kafka), "bench")
        check_s = time.monotonic() - t
        assert report.passed, (report.summary(), report.progress)
        assert report.source_rows == report.replica_rows == args.rows, report.summary()

        checksums = []
        with server.connect() as conn, conn.cursor() as cur:
            for _ in range(3):
                t = time.monotonic()
                cur.execute("CHECKSUM TABLE bench.orders")
                cur.fetchall()
                checksums.append(time.monotonic() - t)
        plain = statistics.median(checksums)
        print(f"load average: {began_load:.2f} at start, {start_load:.2f} before the check, "
              f"{load_average():.2f} at the end")
        print(f"parity check: {check_s:.1f}s end to end, {report.chunks} chunks, "
              f"{report.source_rows:,} rows; source (server-side aggregates) "
              f"{report.source_seconds:.1f}s, wait {report.wait_seconds:.2f}s, replica "
              f"(delta-rs + Python) {report.replica_seconds:.1f}s; {report.progress}")
        print(f"CHECKSUM TABLE: {plain:.2f}s (median of {[round(c, 2) for c in checksums]})")
        print(f"ratio: check / CHECKSUM TABLE {check_s / plain:.1f}, source side / CHECKSUM "
              f"TABLE {report.source_seconds / plain:.1f}; target: check <= 60 s "
              f"({'met' if check_s <= 60 else 'MISSED'})")
    finally:
        broker.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
