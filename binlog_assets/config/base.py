"""What every section of the pipeline config shares: its base model, its error, and
the plain identifiers that go into SQL and topic names unquoted."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
)


class ConfigError(ValueError):
    """A configuration problem; the message names the offending field."""


class ConfigModel(BaseModel):
    """A section of the pipeline config: unknown keys fail, values are frozen."""


    model_config = ConfigDict(extra="forbid", frozen=True)


# Matched whole (`fullmatch`): `$` would also match before a trailing newline.
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _plain_identifier(v: str) -> str:
    if not _IDENT.fullmatch(v):
        raise ValueError("must be a plain identifier ([A-Za-z_][A-Za-z0-9_]*)")
    return v


# A name that goes into SQL and topic names unquoted: checked whole, once, here.
Identifier = Annotated[str, AfterValidator(_plain_identifier)]
