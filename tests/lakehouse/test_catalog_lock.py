"""The local catalog lock: one process with Spark on an embedded-Derby lakehouse at a time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from binlog_assets.config import parse_config
from binlog_assets.lakehouse import spark as spark_module
from binlog_assets.lakehouse.spark import hold_catalog_lock, uses_embedded_catalog


def _config(path: Path, **spark_conf: str):
    return parse_config({"lakehouse": {"path": str(path)}, "spark": {"conf": spark_conf}})


def test_a_second_process_waits_for_the_lock_and_names_the_holder(tmp_path: Path,
                                                                  monkeypatch) -> None:
    monkeypatch.setattr(spark_module, "_CATALOG_LOCKS", {})
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from binlog_assets.config import parse_config
        from binlog_assets.lakehouse.spark import hold_catalog_lock
        hold_catalog_lock(parse_config({{"lakehouse": {{"path": {str(tmp_path)!r}}}}}))
        print("held", flush=True)
        sys.stdin.readline()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        began = time.monotonic()
        with pytest.raises(TimeoutError, match=rf"locked by pid {holder.pid} for 1s"):
            hold_catalog_lock(_config(tmp_path), timeout=1.0)
        assert time.monotonic() - began >= 1.0
    finally:
        holder.stdin.close()  # the holder exits; the kernel drops its lock
        holder.wait(30)
    hold_catalog_lock(_config(tmp_path), timeout=5.0)
    hold_catalog_lock(_config(tmp_path), timeout=0.0)  # held by this process: no-op
    assert (tmp_path / "catalog.lock").read_text() == str(os.getpid())


def test_only_an_embedded_local_catalog_is_locked(tmp_path: Path) -> None:
    assert uses_embedded_catalog(_config(tmp_path))
    assert not uses_embedded_catalog(_config(
        tmp_path, **{"spark.hadoop.javax.jdo.option.ConnectionURL": "jdbc:postgresql://m/h"}))
    assert not uses_embedded_catalog(parse_config({"lakehouse": {"path": "s3a://b/lake"}}))
