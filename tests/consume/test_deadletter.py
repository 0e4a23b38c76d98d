"""`DeadLetterPublisher` against a fake producer: the record leaves with its original bytes
and its coordinates, and `flush` raises unless every dead letter was acknowledged."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from binlog_assets.consume import deadletter
from binlog_assets.consume.deadletter import (
    MAX_ERROR_BYTES,
    DeadLetter,
    DeadLetterPublisher,
    coordinate_headers,
)

ORIGINAL_HEADERS = (("traceparent", b"00-ab"), ("source", b"\xff\x00"))


def _letter(offset: int = 7, error: str = "boom", **changes: object) -> DeadLetter:
    fields = dict(topic="shop.orders", partition=3, offset=offset, key=b'{"id": 1}',
                  value=b'{"op": "c"}', headers=ORIGINAL_HEADERS, stage="handler",
                  error=error, attempts=4)
    return DeadLetter(**{**fields, **changes})


class FakeProducer:
    """Queues records; `poll` and `flush` acknowledge them, failing the offsets in
    `failing` (read from the `binlake.offset` header) and holding all while `held`."""

    def __init__(self, conf: dict) -> None:
        self.conf = conf
        self.queued: list[tuple] = []
        self.produced: list[dict] = []
        self.failing: set[int] = set()
        self.held = False

    def produce(self, topic: str, *, key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes]], on_delivery) -> None:
        record = {"topic": topic, "key": key, "value": value, "headers": headers}
        self.produced.append(record)
        self.queued.append((record, on_delivery))

    def _deliver(self) -> None:
        if self.held:
            return
        queued, self.queued = self.queued, []
        for record, on_delivery in queued:
            offset = int(dict(record["headers"])["binlake.offset"])
            err = KafkaError(KafkaError._MSG_TIMED_OUT) if offset in self.failing else None
            on_delivery(err, None)

    def poll(self, timeout: float) -> int:
        self._deliver()
        return 0

    def flush(self, timeout: float) -> int:
        self._deliver()
        return len(self.queued)


@pytest.fixture
def publisher(monkeypatch: pytest.MonkeyPatch) -> DeadLetterPublisher:
    monkeypatch.setattr(deadletter, "Producer", FakeProducer)
    return DeadLetterPublisher({"bootstrap.servers": "b:9092", "acks": "1"}, "binlake.dlq.shop")


def test_coordinate_headers_name_the_source_stage_error_and_attempts() -> None:
    assert coordinate_headers(_letter()) == [
        ("binlake.topic", b"shop.orders"),
        ("binlake.partition", b"3"),
        ("binlake.offset", b"7"),
        ("binlake.stage", b"handler"),
        ("binlake.error", b"boom"),
        ("binlake.attempts", b"4"),
    ]


def test_a_long_or_unencodable_error_is_cut_and_replaced_not_raised() -> None:
    error = dict(coordinate_headers(_letter(error="x" * (MAX_ERROR_BYTES + 500))))
    assert error["binlake.error"] == b"x" * MAX_ERROR_BYTES
    lone_surrogate = dict(coordinate_headers(_letter(error="bad \udc80 byte")))
    assert lone_surrogate["binlake.error"] == b"bad ? byte"


def test_the_producer_is_idempotent_and_waits_for_all_replicas(
        publisher: DeadLetterPublisher) -> None:
    conf = publisher._producer.conf
    assert conf["enable.idempotence"] is True
    assert conf["acks"] == "all"  # the caller's acks=1 may not weaken it
    assert conf["bootstrap.servers"] == "b:9092"


def test_a_dead_letter_keeps_its_bytes_and_gains_its_coordinates(
        publisher: DeadLetterPublisher) -> None:
    letter = _letter(key=None, value=b"\x00not json")
    publisher.publish(letter)
    [record] = publisher._producer.produced
    assert record["topic"] == "binlake.dlq.shop"
    assert (record["key"], record["value"]) == (None, b"\x00not json")
    # The original headers first, byte for byte, then binlake's.
    assert record["headers"] == list(ORIGINAL_HEADERS) + coordinate_headers(letter)


def test_flush_counts_acknowledged_letters(publisher: DeadLetterPublisher) -> None:
    for offset in range(3):
        publisher.publish(_letter(offset))
    publisher.flush()
    assert publisher.published == 3


def test_flush_raises_naming_each_letter_the_broker_refused(
        publisher: DeadLetterPublisher) -> None:
    publisher._producer.failing = {1, 2}
    for offset in range(4):
        publisher.publish(_letter(offset))
    with pytest.raises(RuntimeError, match="dead-letter delivery to binlake.dlq.shop failed") as e:
        publisher.flush()
    assert "shop.orders[3]@1" in str(e.value) and "shop.orders[3]@2" in str(e.value)
    assert "shop.orders[3]@0" not in str(e.value)
    assert publisher.published == 2


def test_flush_raises_while_letters_are_unacknowledged(publisher: DeadLetterPublisher) -> None:
    publisher._producer.held = True
    publisher.publish(_letter())
    with pytest.raises(RuntimeError, match="1 dead letters still unacknowledged after 0.5s"):
        publisher.flush(0.5)
    assert publisher.published == 0


def test_the_fault_point_falls_between_the_send_and_its_acknowledgement(
        publisher: DeadLetterPublisher, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, int, int]] = []
    producer = publisher._producer
    monkeypatch.setattr(deadletter, "fault_point", lambda name: seen.append(
        (name, len(producer.produced), publisher.published)))
    publisher.publish(_letter())
    assert seen == [("after_dead_letter_send", 1, 0)]  # produced, not yet acknowledged
    assert publisher.published == 1  # the poll after it delivered

