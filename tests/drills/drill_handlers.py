"""Per-table handlers the drill runs load (`drill_handlers:registry`).

Every event goes through the lanes, so a kill can land with handlers in flight. Events of
customer rows named `POISON_NAME` (rows the SIGKILL drill writes on purpose each trial)
always fail: they are retried, then dead-lettered, so every trial has dead letters in
flight and the `after_dead_letter_send` boundary is reached. The drill asks `poisoned`
which events must end up in the dead-letter topic.
"""

from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.formats.event import ChangeEvent

POISON_TABLE = "shop.customers"
POISON_NAME = "drill-poison"


class PoisonedRow(Exception):
    """The drill's deliberate handler failure."""


def poisoned(event: ChangeEvent) -> bool:
    """Whether the drill's handler fails on `event` (on every attempt)."""
    if event.table != POISON_TABLE or event.op not in ("c", "r", "u", "d"):
        return False
    return any((row or {}).get("name") == POISON_NAME for row in (event.before, event.after))


def handle(event: ChangeEvent) -> None:
    if poisoned(event):
        raise PoisonedRow(f"{event.table} {event.key!r}: the drill poisons this row")


registry = HandlerRegistry()
registry.register(r".*", handle, name="drill-poison-or-noop")
