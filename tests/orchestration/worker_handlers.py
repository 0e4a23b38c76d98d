"""Handlers a worker-process test names in its config (`worker_handlers:registry`): each
event handled is written to the file `BINLAKE_TEST_HANDLED` names, with the process that
handled it and its coordinates; `BINLAKE_TEST_HANDLER_MS` slows each event down. The
handler takes batches, or one event at a time with `BINLAKE_TEST_HANDLER_ONE_BY_ONE` set
(the handler call in progress is then one event long)."""

from __future__ import annotations

import os
import time

from binlog_assets.consume.handlers import HandlerRegistry


def record(events) -> None:  # binlake's ChangeEvents
    time.sleep(float(os.environ.get("BINLAKE_TEST_HANDLER_MS", "0")) / 1000 * len(events))
    with open(os.environ["BINLAKE_TEST_HANDLED"], "a") as f:
        f.write("".join(f"{os.getpid()} {e.partition} {e.offset}\n" for e in events))


def record_one(event) -> None:  # a binlake ChangeEvent
    record([event])


registry = HandlerRegistry()
if os.environ.get("BINLAKE_TEST_HANDLER_ONE_BY_ONE"):
    registry.register("shop.t", record_one, name="record")
else:
    registry.register("shop.t", record, name="record", batch=True)
