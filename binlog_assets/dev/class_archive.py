"""A class-data archive for the Spark driver JVM: Spark's, Delta's and the catalog's
classes, parsed and verified once and mapped into every later driver at its start.

A driver loads tens of thousands of classes in its start and its first replica build.
The JDK's dynamic class-data sharing records the ones a training driver loaded when it
exits (`-XX:ArchiveClassesAtExit`); later drivers map that file
(`-XX:SharedArchiveFile`, which `spark_conf` adds when the file exists). The JVM checks
that an archive matches its own build and class path and runs without it otherwise, so
a stale archive costs its benefit, never a failure; its file name is a key of the JDK,
PySpark and Delta it was made with, so an upgrade looks for a new one. A damaged file is
another matter (the JVM dies mapping a truncated one), so a new archive is put in place
only after a driver mapped it (`check`).

`make setup` builds it (`python -m binlog_assets.dev.class_archive`): a training
driver applies a few changes to a replica in a scratch lakehouse, the way a build does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from binlog_assets.lakehouse.spark import QUIET, archive_file

BUILD_TIMEOUT_SECONDS = 600


def build(*, force: bool = False) -> Path:
    """Make the archive (a training driver in a child process); returns its path."""
    target = archive_file()
    if target.is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.stem}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "binlog_assets.dev.class_archive", "--train",
                    str(partial)],
                   check=True, timeout=BUILD_TIMEOUT_SECONDS)
    if not partial.is_file():
        raise RuntimeError(f"the training driver wrote no class archive at {partial}")
    try:
        check(partial)
    except RuntimeError:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, target)
    for stale in target.parent.glob("driver-*.jsa"):
        if stale != target:
            stale.unlink(missing_ok=True)
    return target


_CHECK = """
import sys
from binlog_assets.config import parse_config
from binlog_assets.lakehouse.spark import get_spark
lake, options = sys.argv[1], sys.argv[2]
config = parse_config({"lakehouse": {"path": lake}, "spark": {"conf": {
    "spark.driver.extraJavaOptions": f"-Dderby.system.home={lake} {options}"}}})
print("rows", get_spark(config).range(3).count())
"""


def check(archive: Path, extra_options: str = "") -> None:
    """Start a driver as binlake configures one (plus `extra_options`), which must map
    `archive` (-Xshare:on makes the JVM fail rather than run without it) and run a
    query; RuntimeError if not."""
    with tempfile.TemporaryDirectory(prefix="binlake-cds-check-") as scratch:
        options = (f"-XX:SharedArchiveFile={archive} -Xshare:on "
                   f"-XX:ErrorFile={scratch}/hs_err_%p.log {extra_options}")
        done = subprocess.run([sys.executable, "-c", _CHECK, scratch, options],
                              capture_output=True, text=True, cwd=scratch,
                              timeout=BUILD_TIMEOUT_SECONDS)
    if done.returncode != 0 or "rows 3" not in done.stdout:
        raise RuntimeError(f"a Spark driver could not map the class archive {archive} "
                           f"(exit {done.returncode}): {done.stderr[-2000:]}")


def _train(archive: Path) -> None:
    """Run a replica build on a scratch lakehouse in a driver that writes `archive` as
    its JVM exits."""
    from decimal import Decimal

    from pyspark import SparkContext

    from binlog_assets.config import parse_config
    from binlog_assets.formats.event import ChangeEvent, Position
    from binlog_assets.lakehouse.changelog import ChangelogWriter, PartitionWrite
    from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
    from binlog_assets.lakehouse.spark import get_spark

    with tempfile.TemporaryDirectory(prefix="binlake-cds-") as lake:
        pipeline = parse_config({
            "kafka": {"bootstrap.servers": "127.0.0.1:9"},
            "lakehouse": {"path": lake, "database": "cds"},
            "spark": {"conf": {"spark.driver.extraJavaOptions":
                               f"-Dderby.system.home={lake} "
                               f"-XX:ArchiveClassesAtExit={archive} {QUIET}"}},
            "sources": [{"name": "shop", "format": "debezium", "topics": ["binlog"],
                         "tables": [{"source": "shop.orders", "replica": "orders"}]}],
        })
        types = {"id": "bigint", "amount": "decimal(10,2)", "note": "string"}
        offset = 0

        def event(op: str, ident: int, before: dict | None, after: dict | None
                  ) -> ChangeEvent:
            return ChangeEvent("shop.orders", op, (ident,), ("id",), before, after,
                               Position(file=1, pos=100 + offset),
                               1_700_000_000_000 + offset, column_types=types,
                               topic="binlog", partition=0, offset=offset)

        def row(ident: int, amount: str) -> dict:
            return {"id": ident, "amount": Decimal(amount), "note": f"n{ident}"}

        writer = ChangelogWriter(pipeline)
        spark = get_spark(pipeline)
        builder = ReplicaBuilder(spark, pipeline)
        # Each way an apply writes: a new replica created with its rows, a MERGE of a
        # few changes, a rewrite for a batch large against the replica.
        for batch in ([("c", i, None, row(i, "1.00")) for i in range(1, 9)],
                      [("u", 1, row(1, "1.00"), row(1, "2.50")),
                       ("d", 2, row(2, "1.00"), None)],
                      [("u", i, row(i, "1.00"), row(i, "3.00")) for i in range(3, 9)]):
            events = []
            for op, ident, before, after in batch:
                events.append(event(op, ident, before, after))
                offset += 1
            writer.write(PartitionWrite(events, {e.offset: b"{}" for e in events},
                                        group_id="cds", topic="binlog", partition=0,
                                        end_offset=offset))
            builder.apply("orders")
        spark.table("cds.orders_current").collect()
        gateway = SparkContext._gateway
        spark.stop()
        # The JVM writes the archive as it exits, which it does when its stdin closes.
        gateway.shutdown()
        gateway.proc.stdin.close()
        if gateway.proc.wait(timeout=BUILD_TIMEOUT_SECONDS) != 0:
            raise RuntimeError(f"the training driver exited with {gateway.proc.returncode}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild a present archive")
    parser.add_argument("--train", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train:
        _train(args.train)
        return
    present = archive_file().is_file() and not args.force
    path = build(force=args.force)
    size = path.stat().st_size / 2**20
    print(f"Spark driver class archive: {path} ({size:.0f} MiB{', present' if present else ''})")


if __name__ == "__main__":
    main()
