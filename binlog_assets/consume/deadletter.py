"""Dead-letter publishing: a bad message leaves the stream with its coordinates attached.

The dead-letter record keeps the original key, value and headers byte for byte and adds
`binlake.*` headers naming where it came from (topic, partition, offset), the stage that
failed (`decode` or `handler`), the error and the attempt count. A dead-lettered event
only counts as done once its delivery is acknowledged: `flush()` raises when any
delivery failed, and the run commits nothing past that point.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import orjson
from confluent_kafka import KafkaError, Message, Producer

from binlog_assets.faults import fault_point
from binlog_assets.formats.event import ChangeEvent

HEADER_PREFIX = "binlake."
MAX_ERROR_BYTES = 2000


@dataclass(frozen=True)
class DeadLetter:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    stage: str
    error: str
    attempts: int


def event_bytes(event: ChangeEvent) -> bytes:
    """A handler's dead letter's value: the event it failed on, as JSON."""
    return orjson.dumps(
        {"table": event.table, "op": event.op, "key": list(event.key), "before": event.before,
         "after": event.after, "position": list(event.position)},
        default=str,
    )


def coordinate_headers(dl: DeadLetter) -> list[tuple[str, bytes]]:
    return [
        (f"{HEADER_PREFIX}topic", dl.topic.encode()),
        (f"{HEADER_PREFIX}partition", str(dl.partition).encode()),
        (f"{HEADER_PREFIX}offset", str(dl.offset).encode()),
        (f"{HEADER_PREFIX}stage", dl.stage.encode()),
        (f"{HEADER_PREFIX}error", dl.error.encode(errors="replace")[:MAX_ERROR_BYTES]),
        (f"{HEADER_PREFIX}attempts", str(dl.attempts).encode()),
    ]


class DeadLetterPublisher:
    """Publishes dead letters to one topic; safe to call from every lane thread."""

    def __init__(self, producer_conf: dict, topic: str) -> None:
        self.topic = topic
        self._producer = Producer({**producer_conf, "enable.idempotence": True, "acks": "all"})
        self._lock = threading.Lock()
        self._failures: list[str] = []
        self.published = 0

    def publish(self, dl: DeadLetter) -> None:
        def delivered(err: KafkaError | None, msg: Message) -> None:
            with self._lock:
                if err is not None:
                    self._failures.append(f"{dl.topic}[{dl.partition}]@{dl.offset}: {err}")
                else:
                    self.published += 1

        self._producer.produce(
            self.topic, key=dl.key, value=dl.value,
            headers=list(dl.headers) + coordinate_headers(dl), on_delivery=delivered,
        )
        # Queued, not acknowledged: a crash here must find the event not committed past.
        fault_point("after_dead_letter_send")
        self._producer.poll(0)

    def flush(self, timeout: float = 60.0) -> None:
        """Wait for every dead letter's acknowledgement; raise if any was not delivered."""
        remaining = self._producer.flush(timeout)
        with self._lock:
            failures = list(self._failures)
        if remaining:
            failures.append(f"{remaining} dead letters still unacknowledged after {timeout}s")
        if failures:
            raise RuntimeError(f"dead-letter delivery to {self.topic} failed: {failures[:5]}")
