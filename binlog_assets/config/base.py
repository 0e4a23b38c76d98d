"""What every section of the pipeline config shares: its base model, its error, and
the plain identifiers that go into SQL and topic names unquoted."""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    model_validator,
)

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration problem; the message names the offending field."""


class ConfigModel(BaseModel):
    """A section of the pipeline config: unknown keys fail, values are frozen. A key
    renamed since (`RENAMED`: old -> new) is still read, with a warning naming both."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    RENAMED: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        if not cls.RENAMED or not isinstance(data, dict):
            return data
        data = dict(data)
        for old, new in cls.RENAMED.items():
            if old not in data:
                continue
            if new in data:
                raise ValueError(f"{old!r} is the old name of {new!r}: give only {new!r}")
            log.warning("binlake config: %r is renamed %r; the old name still works "
                        "for now", old, new)
            data[new] = data.pop(old)
        return data


# Matched whole (`fullmatch`): `$` would also match before a trailing newline.
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _plain_identifier(v: str) -> str:
    if not _IDENT.fullmatch(v):
        raise ValueError("must be a plain identifier ([A-Za-z_][A-Za-z0-9_]*)")
    return v


# A name that goes into SQL and topic names unquoted: checked whole, once, here.
Identifier = Annotated[str, AfterValidator(_plain_identifier)]
