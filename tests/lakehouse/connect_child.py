"""Child process of test_spark_connect: one scenario through a Spark Connect session.

PySpark picks classic or Connect columns per process (`SPARK_CONNECT_MODE_ENABLED`), so
a remote session cannot share the test process with the suite's in-process one.
Usage: connect_child.py <config.yaml> <rewrite_ratio>...; prints each scenario's rows.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from lake_events import config_for
from test_spark_connect import TABLES, scenario

from binlog_assets.config import load_config
from binlog_assets.lakehouse.delta_log import is_remote
from binlog_assets.lakehouse.spark import get_spark


def main() -> None:
    base = load_config(sys.argv[1])
    spark = get_spark(base)
    assert is_remote(spark), type(spark)
    print(repr([scenario(spark, config_for(base, TABLES, rewrite_ratio=float(ratio)))
                for ratio in sys.argv[2:]]))


if __name__ == "__main__":
    main()
