"""A replica's record of the loads written straight into it (`binlog_assets/load/direct.py`).

Such a load writes each chunk twice: to the changelog, its rows under the load's own
topic (`load_topic`), and to the replica, typed and appended. The replica's table
property `binlake.loads` names each such topic with its state. An apply of the replica
leaves the recorded topics' changelog rows out (the replica holds them already) and
applies nothing while a load is `loading` (its chunks are being appended, which a MERGE
beside them would conflict with or duplicate). A rebuild drops the table, and with it the
record: it applies those rows as any others, so the changelog stays the replica's truth.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from binlog_assets.lakehouse.delta_log import set_properties

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

LOADS_PROPERTY = "binlake.loads"
LOAD_TOPIC_PREFIX = "binlake-load/"
LOADING, LOADED = "loading", "loaded"


def load_topic(load_id: str) -> str:
    """The changelog topic of a load's rows that its replica holds already."""
    return f"{LOAD_TOPIC_PREFIX}{load_id}"


def recorded_loads(props: dict[str, str]) -> dict[str, dict]:
    """topic -> {"state": LOADING or LOADED, "first": first chunk written straight,
    "version": the replica's version before the load appended to it}."""
    text = props.get(LOADS_PROPERTY)
    return {} if not text else dict(json.loads(text))


def loading(props: dict[str, str]) -> list[str]:
    """The topics of the loads still appending to the replica."""
    return sorted(t for t, load in recorded_loads(props).items() if load["state"] == LOADING)


def record_load(spark: SparkSession, table: tuple[str, str], props: dict[str, str],
                topic: str, *, state: str, first: int, version: int) -> dict[str, str]:
    """Records the load `topic` in `state` on the replica; its properties after."""
    loads = {**recorded_loads(props),
             topic: {"state": state, "first": first, "version": version}}
    text = json.dumps(loads, sort_keys=True)
    set_properties(spark, table, {LOADS_PROPERTY: text})
    return {**props, LOADS_PROPERTY: text}


def without_loads(batch: DataFrame, props: dict[str, str]) -> DataFrame:
    """`batch` (changelog rows) without the rows of the loads the replica holds."""
    from pyspark.sql import functions as F

    keep = None
    # `!=` rather than NOT IN: Parquet skips a row group whose topic is only the load's
    # by its statistics, so the load's rows are not even read.
    for topic in sorted(recorded_loads(props)):
        differs = F.col("topic") != F.lit(topic)
        keep = differs if keep is None else keep & differs
    return batch if keep is None else batch.where(keep)
