"""The parity check's settings: a source's read-only connection (`sources[].connection`)
and how the check reads its sources (`parity`), validated with the pipeline config."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from binlog_assets.config.base import ConfigModel

TlsMode = Literal["disabled", "required", "verify_ca", "verify_identity"]


class TlsConfig(ConfigModel):
    """TLS to the source database; `required` encrypts without checking the server,
    `verify_ca` checks its certificate against `ca`, `verify_identity` its name too."""

    mode: TlsMode = Field("required", description="`required`, `verify_ca` or "
                                                   "`verify_identity`")
    ca: str | None = Field(None, description="CA certificate file (PEM)")
    cert: str | None = Field(None, description="client certificate file (PEM)")
    key: str | None = Field(None, description="client key file (PEM)")

    @field_validator("ca", "cert", "key")
    @classmethod
    def _file_exists(cls, v: str | None) -> str | None:
        # Checked here, so a bad path fails the code location, not the first check run.
        if v is not None and not Path(v).is_file():
            raise ValueError(f"no such file {v!r}")
        return v

    @model_validator(mode="after")
    def _verification_has_a_ca(self) -> TlsConfig:
        if self.mode in ("verify_ca", "verify_identity") and self.ca is None:
            raise ValueError(f"mode {self.mode!r} checks the server's certificate: give `ca`")
        if (self.cert is None) != (self.key is None):
            raise ValueError("a client certificate needs both `cert` and `key`")
        return self


class SourceConnection(ConfigModel):
    """A read-only connection to a source database, for the parity check (README:
    Parity check). Give the password as `${ENV}` so it stays out of the file."""

    host: str = Field(min_length=1, pattern=r"^\S+$", description="the database's host")
    port: int = Field(3306, ge=1, le=65535, description="the database's port")
    user: str = Field(min_length=1, description="a read-only account (README: the grants)")
    # repr=False: a config printed in a log or an error never shows it.
    password: str = Field("", repr=False, description="its password, as `${ENV}`")
    tls: TlsConfig | None = Field(None, description="unset: no TLS")
    connect_timeout_seconds: float = Field(10.0, gt=0, le=600,
                                           description="a connection attempt fails after this")


class ParityConfig(ConfigModel):
    """How the parity check reads a source (README: Parity check): its load on the source
    is one aggregate query per chunk of `chunk_rows` keys, each in a short transaction."""

    chunk_rows: int = Field(10_000, ge=10, le=10_000_000,
                            description="keys per chunk: one aggregate query on the source")
    pause_seconds: float = Field(0.0, ge=0, le=60,
                                 description="a pause between two chunks' queries")
    wait_seconds: float = Field(
        300.0, gt=0, le=86_400,
        description="how long the check waits for the replica to apply past the source's "
                    "snapshot position before it fails saying so")
    sample_keys: int = Field(20, ge=1, le=10_000, description="differing keys reported")
    schedule: str | None = Field(
        None, description="a cron schedule for `parity_check_job` over every checked "
                          "replica (unset: launched by hand only)")
    block_dbt: bool = Field(
        False, description="while a replica's latest parity check failed, dbt builds wait "
                           "(dbt_follow_sensor skips, a launched build fails naming it)")
    resync: bool = Field(
        False, description="when a replica's parity check fails, `parity_resync_sensor` "
                           "launches `resync_replica_job` for each chunk it found wrong")

    @field_validator("schedule")
    @classmethod
    def _cron_parses(cls, v: str | None) -> str | None:
        if v is not None and len(v.split()) != 5:
            raise ValueError(f"{v!r} is not a five-field cron expression")
        return v
