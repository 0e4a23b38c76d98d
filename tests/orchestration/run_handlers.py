"""Handlers a consume-run test names in its config (`run_handlers:registry`): a batch
handler object that counts its opens and closes, and a handler that always fails on one
row so that its dead letter can be checked."""

from __future__ import annotations

from binlog_assets.consume.handlers import HandlerRegistry

BAD_ID = 3


class Counting:
    opened = closed = 0
    seen: list[int] = []

    def open(self) -> None:
        Counting.opened += 1

    def close(self) -> None:
        Counting.closed += 1

    def __call__(self, events) -> None:
        Counting.seen.extend(e.key[0] for e in events)


def picky(event) -> None:
    if event.key == (BAD_ID,):
        raise ValueError(f"row {BAD_ID} is refused")


registry = HandlerRegistry()
registry.register("shop.t", Counting(), name="counting", batch=True)
registry.register("shop.t", picky, name="picky")
