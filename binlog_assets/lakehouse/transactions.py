"""The Delta transaction ids binlake writes under, in one place.

The changelog records each consumer group's progress per topic-partition as an
application transaction (delta-rs, `changelog_app_id`, version = the end offset), and
replica builds record the changelog version they applied (Spark, `APP_ID`, within a
`SparkTxn` block or as DataFrameWriter options), atomically with the data. A retried
commit of a version the table already holds is skipped (Spark) or refused by the fence
(the changelog, delta-rs #2580).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The Delta transaction id under which replica (and history) MERGEs record the applied
# changelog version.
APP_ID = "binlake.replica"

# Session settings are per SparkSession; the builder's own session holds them, and the
# lock keeps two threads of one builder from interleaving their transaction ids.
_TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"


def changelog_app_id(group_id: str, topic: str, partition: int) -> str:
    """The Delta transaction id of one consumer group's writes for one topic-partition."""
    return f"{group_id}/{topic}/{partition}"


# A partition's tail (the furthest position it placed: `consume/lineage.py`) rides in the
# same commits as its rows, as two more transactions of two numbers each: `#lineage` the
# lineage and the server id plus one (0: none known, so a run's first event of the same
# server further on is placed without reading the tail's row), `#binlog` the file and
# position. Two, not four: delta-rs reads the log again for every transaction it answers.
TAIL_PARTS = ("lineage", "binlog")
_SERVER_BITS = 33  # a server id is 32 bits, plus one
_POS_BITS = 32  # a binlog position is 32 bits (a MySQL event header's log_pos)


def tail_app_ids(txn: str) -> tuple[str, ...]:
    """The transaction ids of the tail of the partition whose changelog id is `txn`."""
    return tuple(f"{txn}#{part}" for part in TAIL_PARTS)


def tail_versions(lineage: int, file: int, pos: int, server_id: int | None
                  ) -> tuple[int, int]:
    """The versions of `tail_app_ids` for a tail; raises ValueError for a part that does
    not fit its bits."""
    server = 0 if server_id is None else server_id + 1
    for name, value, bits in (("server id", server, _SERVER_BITS), ("binlog position", pos,
                                                                    _POS_BITS),
                              ("lineage", lineage, 63 - _SERVER_BITS),
                              ("binlog file", file, 63 - _POS_BITS)):
        if not 0 <= value < 1 << bits:
            raise ValueError(f"a partition tail's {name} {value} is out of range")
    return lineage << _SERVER_BITS | server, file << _POS_BITS | pos


def tail_parts(lineage_version: int, binlog_version: int
               ) -> tuple[int, int, int, int | None]:
    """(lineage, file, position, server id or None) of `tail_versions`."""
    server = lineage_version & ((1 << _SERVER_BITS) - 1)
    return (lineage_version >> _SERVER_BITS, binlog_version >> _POS_BITS,
            binlog_version & ((1 << _POS_BITS) - 1), server - 1 if server else None)


def lineage_app_id(source: str) -> str:
    """The transaction id whose version is the source's latest lineage, committed with
    each raise: two partitions raising at once conflict, and one reads the other's."""
    return f"binlake.lineage/{source}"


class SparkTxn:
    """Within the block, Delta DML commits carry (APP_ID, version) and are skipped when
    the table already recorded that version or a later one."""

    def __init__(self, spark: SparkSession, version: int) -> None:
        self.spark = spark
        self.version = version

    def __enter__(self) -> None:
        self.spark.conf.set(_TXN_APP_ID, APP_ID)
        self.spark.conf.set(_TXN_VERSION, str(self.version))

    def __exit__(self, *exc: Any) -> None:
        self.spark.conf.unset(_TXN_APP_ID)
        self.spark.conf.unset(_TXN_VERSION)
