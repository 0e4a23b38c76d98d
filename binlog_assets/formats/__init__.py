"""The change-event formats binlake reads, by name: one decoder class per producer.

Callers pick a decoder with `make_decoder("debezium")` (the name a pipeline's config
carries) and feed it Kafka records; every decoder has the same `decode` signature and
returns `ChangeEvent`s (see `event.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from binlog_assets.formats.base import ChangeDecoder
from binlog_assets.formats.canal import CanalDecoder
from binlog_assets.formats.debezium import DebeziumDecoder
from binlog_assets.formats.dts import DtsDecoder
from binlog_assets.formats.maxwell import MaxwellDecoder

DECODERS: dict[str, type[ChangeDecoder]] = {
    DebeziumDecoder.name: DebeziumDecoder,
    MaxwellDecoder.name: MaxwellDecoder,
    CanalDecoder.name: CanalDecoder,
    DtsDecoder.name: DtsDecoder,
}


def make_decoder(
    name: str, key_columns: Mapping[str, Sequence[str]] | None = None
) -> ChangeDecoder:
    """A fresh decoder for format `name`; `key_columns` overrides primary keys per table."""
    try:
        decoder_class = DECODERS[name]
    except KeyError:
        raise ValueError(
            f"unknown change-event format {name!r}; known formats: {', '.join(sorted(DECODERS))}"
        ) from None
    return decoder_class(key_columns)


__all__ = [
    "DECODERS",
    "CanalDecoder",
    "ChangeDecoder",
    "DebeziumDecoder",
    "DtsDecoder",
    "MaxwellDecoder",
    "make_decoder",
]
