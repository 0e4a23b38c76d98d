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
# same commits as its rows, as four more transactions: lineage, binlog file, position and
# the server id plus one (0: none known), which lets a run's first event that the same
# server wrote further on be placed without reading the tail's row.
TAIL_PARTS = ("lineage", "file", "pos", "server")


def tail_app_ids(txn: str) -> tuple[str, ...]:
    """The transaction ids of the tail of the partition whose changelog id is `txn`."""
    return tuple(f"{txn}#{part}" for part in TAIL_PARTS)


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
