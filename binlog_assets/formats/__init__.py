"""The change-event formats binlake reads, by name: one decoder class per producer.

Callers pick a decoder with `make_decoder("debezium")` (the name a pipeline's config
carries) and feed it Kafka records; every decoder has the same `decode` signature and
returns `ChangeEvent`s (see `event.py`). `debezium-avro` also takes the schema registry's
client settings; its module (and confluent-kafka's registry client) loads only when used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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


AVRO_FORMATS = frozenset({"debezium-avro"})


def make_decoder(
    name: str,
    key_columns: Mapping[str, Sequence[str]] | None = None,
    schema_registry: Mapping[str, Any] | None = None,
) -> ChangeDecoder:
    """A fresh decoder for format `name`; `key_columns` overrides primary keys per table;
    `schema_registry` is the registry client's settings (formats in `AVRO_FORMATS`)."""
    if name in AVRO_FORMATS:
        from binlog_assets.formats.debezium_avro import DebeziumAvroDecoder

        return DebeziumAvroDecoder(key_columns, schema_registry)
    try:
        decoder_class = DECODERS[name]
    except KeyError:
        raise ValueError(
            f"unknown change-event format {name!r}; known formats: "
            f"{', '.join(sorted({*DECODERS, *AVRO_FORMATS}))}"
        ) from None
    return decoder_class(key_columns)


__all__ = [
    "AVRO_FORMATS",
    "DECODERS",
    "CanalDecoder",
    "ChangeDecoder",
    "DebeziumDecoder",
    "DtsDecoder",
    "MaxwellDecoder",
    "make_decoder",
]
