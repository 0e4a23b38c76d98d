"""SCD type 2 history of a replica: every version of every row, ordered by position.

`<database>.<replica>_history` (for tables configured with `history: true`) has the
replica's key and source columns plus `_valid_from` (the position of the change that
made the version), `_valid_to` (the position of the next change of that key or of the
table's next truncate; null while open), `_is_current` (open and not deleted), `_op`,
`_source_ts` and `_applied_at`. A delete is a version of its own (`_op = 'd'`, never
current), so a key's chain shows when the row did not exist; a truncate is a marker row
(`_op = 't'`, null key) that closes every version of its table open at that position.

Versions are placed by position, not by arrival: a late change is inserted into its
key's chain and the neighbouring `_valid_to` values are recomputed from the key's whole
chain. A change is identified by its binlog coordinates (`columns.change_identity`), so
a duplicate delivered at another Kafka offset, or a range applied twice, adds nothing.
This is Spark's MERGE; a small batch without truncates gets the same versions from the
driver by delta-rs (`replica/history_arrow.py`).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from binlog_assets.formats.event import OP_DELETE, OP_TRUNCATE
from binlog_assets.identifiers import col, qualified
from binlog_assets.lakehouse.columns import (
    POSITION_TYPE,
    change_identity,
    first_per_group,
    first_truncate_after,
    free_name,
    key_match,
)
from binlog_assets.lakehouse.delta_log import merge_aliases

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

HISTORY_METADATA = (
    ("_valid_from", POSITION_TYPE),
    ("_valid_to", POSITION_TYPE),
    ("_is_current", T.BooleanType()),
    ("_op", T.StringType()),
    ("_source_ts", T.TimestampType()),
    ("_applied_at", T.TimestampType()),
)


def merge_history(
    spark: SparkSession,
    table: tuple[str, str],
    rows: DataFrame,
    key: list[str],
    batch_truncates: dict[str, tuple[int, ...]],
    now: datetime,
) -> None:
    """MERGE the batch's changes (`rows`, as the replica build types them, not reduced)
    into the history table `table`. The caller sets the transaction id."""
    name = qualified(*table)
    history = spark.table(name)
    stored_truncates = [
        (f"{r['_source_db']}.{r['_source_table']}", tuple(r["_valid_from"]))
        for r in history.where(F.col("_op") == OP_TRUNCATE)
        .select("_source_db", "_source_table", "_valid_from").collect()
    ]
    all_truncates = [*stored_truncates, *batch_truncates.items()]

    data = [c for c in rows.columns if c not in key and c not in ("_position", "_op",
                                                                   "_source_ts")]
    # Working columns take names no source column has.
    taken = [*rows.columns, *history.columns]
    from_table, change = free_name("_stored", taken), free_name("_id", taken)
    keep = [*data, "_op", "_source_ts", "_valid_from", "_applied_at", from_table]
    incoming = (rows.withColumnRenamed("_position", "_valid_from")
                .withColumn("_applied_at", F.lit(now)).withColumn(from_table, F.lit(False)))
    is_marker = F.col("_op") == OP_TRUNCATE
    key_columns = [col(k) for k in key]

    # Every stored version of the keys this batch touches: their chains are recomputed.
    touched = incoming.where(~is_marker).select(*key_columns).distinct()
    stored = (history.alias("h").where(~is_marker)
              .join(touched.alias("s"), key_match(key, "h", "s"), "left_semi"))
    stored = stored.select(*key_columns, *[col(c) for c in keep if c != from_table],
                           F.lit(True).alias(from_table))

    # One row per (key, change): a stored version wins over a re-delivered copy, so its
    # `_valid_from` and `_applied_at` stay as first written.
    versions = first_per_group(
        incoming.select(*key_columns, *[col(c) for c in keep]).unionByName(stored)
        .withColumn(change, change_identity(F.col("_valid_from"))),
        [*key_columns, col(change)],
        [col(from_table).desc(), F.col("_valid_from.offset").asc()]).drop(change)
    following = F.lead("_valid_from").over(
        Window.partitionBy(*key_columns).orderBy("_valid_from"))
    valid_to = F.least(following, first_truncate_after(all_truncates, F.col("_valid_from")))
    chain = (versions.where(~is_marker).withColumn("_valid_to", valid_to)
             .withColumn("_is_current", F.col("_valid_to").isNull()
                         & (F.col("_op") != OP_DELETE)))
    marker_rows = (versions.where(is_marker).withColumn("_valid_to", F.col("_valid_from"))
                   .withColumn("_is_current", F.lit(False)))
    source = chain.unionByName(marker_rows).drop(from_table)

    t, s = merge_aliases(table)
    same_change = key_match(key, t, s) & (change_identity(col("_valid_from", t))
                                          == change_identity(col("_valid_from", s)))
    moved = (~col("_valid_to", t).eqNullSafe(col("_valid_to", s))
             | (col("_is_current", t) != col("_is_current", s)))
    merge = (source.alias(s).mergeInto(name, same_change)
             .whenMatched(moved).update({
                 "_valid_to": col("_valid_to", s), "_is_current": col("_is_current", s)})
             .whenNotMatched().insert({qualified(c): col(c, s) for c in source.columns}))
    if batch_truncates:
        # Versions of keys this batch does not touch, open across one of its truncates.
        closing = first_truncate_after(list(batch_truncates.items()),
                                       col("_valid_from", t), t)
        merge = merge.whenNotMatchedBySource(
            (col("_op", t) != OP_TRUNCATE) & closing.isNotNull()
            & (col("_valid_to", t).isNull() | (closing < col("_valid_to", t)))
        ).update({"_valid_to": closing, "_is_current": F.lit(False)})
    merge.merge()
