"""A quick check that the Kafka cluster answers and accepts the configured credentials,
before a run or a sensor tick relies on it.

librdkafka reports a failed SASL handshake only as an error event and keeps retrying:
a consumer polls empty batches and a metadata request waits out its whole timeout, so
wrong credentials would look like an idle topic or a hang. One DescribeCluster request,
with the client's error events served meanwhile, tells within a second which it is.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

# librdkafka's codes for a refused handshake: its own, and the broker's answer.
_AUTH_ERRORS = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}


class KafkaAuthenticationError(RuntimeError):
    """The cluster refused the configured credentials."""


def describe(conf: Mapping[str, object]) -> str:
    """Where a client connects and as whom, never with a secret."""
    who = f" as {conf['sasl.username']}" if conf.get("sasl.username") else ""
    how = conf.get("security.protocol", "PLAINTEXT")
    mechanism = f" {conf['sasl.mechanisms']}" if conf.get("sasl.mechanisms") else ""
    return f"{conf.get('bootstrap.servers')} ({how}{mechanism}){who}"


def check_cluster(conf: Mapping[str, object], timeout: float = 30.0) -> None:
    """Return once the cluster answered; raise `KafkaAuthenticationError` as soon as it
    refuses the credentials, or `KafkaException` when it does not answer in `timeout`."""
    errors: list[KafkaError] = []
    # log_level 3: consumer settings in `conf` would each log a warning on an admin client.
    admin = AdminClient({**conf, "error_cb": errors.append, "log_level": 3})
    answer = admin.describe_cluster(request_timeout=timeout)
    deadline = time.monotonic() + timeout
    while not answer.done():
        admin.poll(0.05)
        refused = [e for e in errors if e.code() in _AUTH_ERRORS]
        if refused:
            raise KafkaAuthenticationError(
                f"Kafka authentication failed for {describe(conf)}: {refused[0].str()} "
                f"(check kafka.sasl.username and the password's environment variable)")
        if time.monotonic() > deadline:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                            f"no answer from {describe(conf)} in {timeout}s"))
    answer.result()
