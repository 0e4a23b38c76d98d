"""A call started in a thread of its own, whose result is asked for later.

binlake overlaps independent waits with it: a run's checkpoint, end offset and lane
threads; an apply's replica snapshot with the changelog's, and the rewrite decision's
row count with building the plan. With `spark=True` the thread is PySpark's
`InheritableThread`: in pinned-thread mode it carries the caller's Spark local
properties (job group, scheduler pool) to the JVM thread that runs its queries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Started(Generic[T]):
    """`call()` running from now on; `result()` waits for it and returns its value or
    raises its error."""

    def __init__(self, call: Callable[[], T], *, name: str = "binlake-background",
                 spark: bool = False) -> None:
        self._call = call
        self._value: T | None = None
        self._error: BaseException | None = None
        if spark:
            from pyspark import InheritableThread

            self._thread: threading.Thread = InheritableThread(
                self._run, name=name, daemon=True)
        else:
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._call()
        except BaseException as exc:  # handed to whoever asks for the result
            self._error = exc

    def result(self, raise_error: bool = True) -> T | None:
        self._thread.join()
        if self._error is not None and raise_error:
            raise self._error
        return self._value
