"""Child process for the crash test: a bounded run whose handler never finishes offset 0.

Run as `python crash_child.py BOOTSTRAP TOPIC GROUP`; the test SIGKILLs it mid-run.
"""

from __future__ import annotations

import sys
import threading

from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.run import BoundedRun, RunSettings


def main() -> None:
    bootstrap, topic, group = sys.argv[1:4]
    never = threading.Event()

    def handler(event) -> None:
        if event.offset == 0:
            never.wait()  # offset 0 is never done: the commit must stay at 0

    reg = HandlerRegistry()
    reg.register(r".*", handler, name="stuck-at-zero")
    settings = RunSettings(
        kafka_conf={"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"},
        group_id=group, format="debezium", lanes=8, commit_interval_seconds=0.2,
    )
    BoundedRun(topic, 0, reg, settings).run()


if __name__ == "__main__":
    main()
