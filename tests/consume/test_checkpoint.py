"""Checkpoint precedence and agreement, without Kafka (sources are plain callables)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from binlog_assets.consume import checkpoint as checkpoint_module
from binlog_assets.consume.checkpoint import (
    CHANGELOG,
    KAFKA,
    RESET,
    Checkpoint,
    override_source,
    resolve_checkpoint,
    retry_retriable,
)


def fixed(cp: Checkpoint | None):
    return lambda: cp


def test_override_wins_over_everything() -> None:
    r = resolve_checkpoint([override_source(42), fixed(Checkpoint(10, CHANGELOG)),
                            fixed(Checkpoint(10, KAFKA))])
    assert (r.chosen.offset, r.chosen.source) == (42, "override")
    assert {c.source for c in r.disagreements} == {CHANGELOG, KAFKA}


def test_first_answer_wins_and_missing_sources_are_passed_over() -> None:
    r = resolve_checkpoint([override_source(None), fixed(None), fixed(Checkpoint(7, KAFKA)),
                            fixed(Checkpoint(0, RESET))])
    assert (r.chosen.offset, r.chosen.source) == (7, KAFKA)
    assert [c.source for c in r.disagreements] == [RESET]


def test_done_beyond_merged_only_from_sources_agreeing_on_the_offset() -> None:
    r = resolve_checkpoint([fixed(Checkpoint(10, CHANGELOG)),
                            fixed(Checkpoint(10, KAFKA, frozenset({12, 13})))])
    assert r.chosen.source == CHANGELOG and r.chosen.done_beyond == {12, 13}
    r = resolve_checkpoint([fixed(Checkpoint(10, CHANGELOG)),
                            fixed(Checkpoint(8, KAFKA, frozenset({12})))])
    assert r.chosen.done_beyond == frozenset()  # Kafka lags the changelog: not trusted


def test_no_source_answers_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="no checkpoint source"):
        resolve_checkpoint([fixed(None)])


def failing(codes: list[int]):
    """A Kafka call that raises each of `codes` in turn, then returns 'ok'."""
    left = list(codes)

    def call() -> str:
        if left:
            raise KafkaException(KafkaError(left.pop(0)))
        return "ok"

    return call


def test_coordinator_waits_are_retried_until_the_call_succeeds(monkeypatch) -> None:
    monkeypatch.setattr(checkpoint_module.time, "sleep", lambda _s: None)
    # What a commit meets while a restarted broker's coordinator comes back.
    call = failing([KafkaError._WAIT_COORD, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                    KafkaError.NOT_COORDINATOR, KafkaError._WAIT_COORD])
    assert retry_retriable(call, "committing") == "ok"


def test_other_kafka_errors_fail_at_once_naming_what_was_done() -> None:
    call = failing([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(RuntimeError, match="committing t\\[0\\]@5: .*"):
        retry_retriable(call, "committing t[0]@5")


def test_coordinator_waits_give_up_at_the_timeout(monkeypatch) -> None:
    monkeypatch.setattr(checkpoint_module.time, "sleep", lambda _s: None)
    call = failing([KafkaError._WAIT_COORD] * 1000)
    with pytest.raises(RuntimeError, match="Waiting for coordinator"):
        retry_retriable(call, "committing", timeout=0.0)


def test_the_reset_offset_never_disagrees() -> None:
    from binlog_assets.consume.checkpoint import disagreements

    candidates = (Checkpoint(5, CHANGELOG), Checkpoint(3, KAFKA), Checkpoint(0, RESET))
    assert disagreements(candidates, 5) == [Checkpoint(3, KAFKA)]
    assert disagreements((Checkpoint(5, CHANGELOG), Checkpoint(0, RESET)), 5) == []
