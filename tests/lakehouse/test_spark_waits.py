"""Spark Connect calls retried while their server does not answer are named, with how
long they have waited, and forgotten once the server answers again."""

from __future__ import annotations

import grpc
from pyspark.sql.connect.client.retries import DefaultPolicy, Retrying

from binlog_assets.lakehouse.spark_waits import (
    QUIET_SECONDS,
    REPORT_EVERY_SECONDS,
    Waits,
    note_retries,
)

URL = "sc://127.0.0.1:15002"


class _RpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> None:  # no status details: no server retry delay
        return None


class _Client:
    """A Connect client's retry policies, as `SparkConnectClient` holds them."""

    def __init__(self) -> None:
        self.policies = [DefaultPolicy()]

    def get_retry_policies(self) -> list:
        return list(self.policies)

    def set_retry_policies(self, policies) -> None:
        self.policies = list(policies)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_call_retried_on_an_unanswering_server_is_named_with_its_wait() -> None:
    clock = _Clock()
    waits = Waits(clock)
    client = _Client()
    note_retries(client, URL, waits)
    tries = iter([_RpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses"),
                  _RpcError(grpc.StatusCode.UNAVAILABLE, "Connection refused"), None])
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += 20

    # The client's own retry loop, with the policies it was given.
    for attempt in Retrying(client.get_retry_policies(), sleep=sleep):
        with attempt:
            error = next(tries)
            if error is not None:
                raise error
    assert len(slept) == 2  # the default back-off kept: retried, not failed
    assert waits.lines() == [
        f"Spark Connect at {URL} has not answered for 40 s (UNAVAILABLE: Connection "
        "refused): the Spark calls on it wait, retried by the client for up to about 10 "
        "minutes"]
    # Once a line is given, the next only after REPORT_EVERY_SECONDS of the same wait.
    clock.now += REPORT_EVERY_SECONDS - 1
    assert waits.lines() == []
    clock.now += 1
    assert len(waits.lines()) == 1
    # No retry for QUIET_SECONDS: the server answers again; a later wait counts anew.
    clock.now += QUIET_SECONDS + 1
    assert waits.lines() == []
    waits.note(URL, "UNAVAILABLE: again")
    clock.now += 5
    assert "has not answered for 5 s (UNAVAILABLE: again)" in waits.lines()[0]


def test_an_error_the_client_does_not_retry_is_not_a_wait() -> None:
    waits = Waits(_Clock())
    client = _Client()
    note_retries(client, URL, waits)
    note_retries(client, URL, waits)  # a session opened again: one policy still
    assert len(client.policies) == 1
    policy = client.policies[0]
    assert isinstance(policy, DefaultPolicy)
    assert not policy.can_retry(_RpcError(grpc.StatusCode.INVALID_ARGUMENT, "bad plan"))
    assert not policy.can_retry(ValueError("not a gRPC error"))
    assert waits.lines() == []
    assert policy.can_retry(_RpcError(grpc.StatusCode.UNAVAILABLE, "down"))
    assert len(waits.lines()) == 1
