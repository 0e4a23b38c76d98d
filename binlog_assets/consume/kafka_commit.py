"""A Kafka offset commit with a deadline.

librdkafka's synchronous commit has no timeout of its own: with the group coordinator
frozen, or cached after a broker restart as a connection that never comes back, it waits
forever, and so does `close()` behind it. The commit runs on a thread of its own; past the
deadline the run fails naming the partition and offset, and the consumer is handed to that
thread, which closes it if the commit ever returns. Nothing is lost: the changelog and the
dead letters were written before the commit, and a rerun resumes from the changelog.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from confluent_kafka import Consumer, TopicPartition

from binlog_assets.consume.checkpoint import retry_retriable

# Beyond the deadline given to the retries, for the call in flight when it passes.
_GRACE_SECONDS = 1.0


class CommitTimeout(RuntimeError):
    """An offset commit got no answer from the group coordinator before the deadline."""


class Committer:
    """Commits a consumer's offsets, each commit within `timeout_seconds`. After a
    timeout the consumer belongs to the stuck commit's thread: `abandoned` is then True
    and the owner must not use or close it."""

    def __init__(self, consumer: Consumer, timeout_seconds: float) -> None:
        self.consumer = consumer
        self.timeout_seconds = timeout_seconds
        self.abandoned = False
        self._lock = threading.Lock()

    def commit(self, offsets: Sequence[TopicPartition], what: str) -> list[TopicPartition]:
        """Commits `offsets`; what the coordinator answered for each (its `error`)."""
        if self.abandoned:
            raise CommitTimeout(f"{what}: an earlier commit of this consumer is still stuck")
        finished = threading.Event()
        outcome: list[BaseException] = []
        answer: list[TopicPartition] = []

        def run() -> None:
            try:
                answer.extend(retry_retriable(
                    lambda: self.consumer.commit(offsets=list(offsets), asynchronous=False),
                    what, self.timeout_seconds) or ())
            except BaseException as e:  # handed to the waiting thread
                outcome.append(e)
            with self._lock:
                finished.set()
                abandoned = self.abandoned
            if abandoned:
                self.consumer.close()

        # A daemon: a commit stuck for good must not keep the process from exiting.
        threading.Thread(target=run, name="binlake-commit", daemon=True).start()
        if not finished.wait(self.timeout_seconds + _GRACE_SECONDS):
            with self._lock:
                if not finished.is_set():
                    self.abandoned = True
            if self.abandoned:
                raise CommitTimeout(
                    f"{what}: the group coordinator did not answer within "
                    f"{self.timeout_seconds:g} s (dagster.commit_timeout_seconds); nothing is "
                    f"lost: a rerun resumes from the run's checkpoint")
        if outcome:
            raise outcome[0]
        return answer
