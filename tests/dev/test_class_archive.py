"""The driver class archive: `spark_conf` maps it when present, and the one `make setup`
built is one a real driver can map (under -Xshare:on the JVM fails otherwise)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.dev import class_archive
from binlog_assets.lakehouse import spark
from binlog_assets.lakehouse.spark import C1_ONLY, spark_conf


def _options(pipeline: PipelineConfig) -> str:
    return spark_conf(pipeline).get("spark.driver.extraJavaOptions", "")


def test_spark_conf_maps_the_archive_only_when_there_is_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "driver-x.jsa"
    monkeypatch.setattr(spark, "archive_file", lambda: archive)
    local = parse_config({"lakehouse": {"path": str(tmp_path / "lake")}})
    assert "SharedArchiveFile" not in _options(local)
    assert f"-Dderby.system.home={tmp_path / 'lake'}" in _options(local)

    archive.write_bytes(b"jsa")
    assert f"-XX:SharedArchiveFile={archive}" in _options(local)
    assert f"-Dderby.system.home={tmp_path / 'lake'}" in _options(local)
    off = parse_config({"lakehouse": {"path": str(tmp_path / "lake")},
                        "spark": {"class_archive": False}})
    assert "SharedArchiveFile" not in _options(off)
    # A lakehouse on S3 has no Derby home: the archive is the driver's only option.
    s3 = parse_config({"lakehouse": {"path": "s3a://lake/binlake"}})
    assert _options(s3) == f"{spark.archive_java_options()} {C1_ONLY}"
    # The user's own driver options replace ours, as any `spark.conf` key does.
    own = parse_config({"lakehouse": {"path": str(tmp_path / "lake")},
                        "spark": {"conf": {"spark.driver.extraJavaOptions": "-Dmine=1"}}})
    assert _options(own) == "-Dmine=1"


def test_a_present_archive_is_not_built_again(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "driver-x.jsa"
    archive.write_bytes(b"jsa")
    monkeypatch.setattr(class_archive, "archive_file", lambda: archive)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("built again"))
    assert class_archive.build() == archive


def test_the_archive_setup_built_maps_into_a_driver(tmp_path: Path) -> None:
    archive = spark.archive_file()
    assert archive.is_file(), f"no class archive at {archive}: `make setup` builds it"
    class_archive.check(archive)
    class_archive.check(archive, C1_ONLY)  # as drivers run by default (spark.driver_jit)
    # The same check refuses a file a driver cannot map (the JVM dies mapping it).
    broken = tmp_path / "broken.jsa"
    with archive.open("rb") as whole:
        broken.write_bytes(whole.read(1_000_000))
    with pytest.raises(RuntimeError, match="could not map the class archive"):
        class_archive.check(broken)
