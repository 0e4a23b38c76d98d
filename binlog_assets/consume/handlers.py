"""Which handlers apply a table's change events: the `HandlerRegistry`.

A handler is a callable taking one `ChangeEvent`. It is registered for a table pattern:
either an exact `db.table` name or a regular expression matched against the whole
`db.table` string (sharded schemas such as `shop_\\d+\\.orders_\\d+`). The lanes ask
`handlers_for(table)` once per event, so the answer is cached per table and the cache is
dropped whenever a handler is registered.

How a pattern is read: a pattern made only of identifier characters (letters, digits,
`_`, `$`, as MySQL allows unquoted) around exactly one dot is an exact name, and its dot
is literal. Anything else is a regular expression, matched with `fullmatch`, so anchors
are never needed (and a trailing `$` reads as part of a table name, as MySQL allows).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from binlog_assets.formats.event import ChangeEvent

HandlerFn = Callable[[ChangeEvent], None]

_EXACT_NAME = re.compile(r"[\w$]+\.[\w$]+")
_IDENTIFIER = re.compile(r"[\w$]+")


@dataclass(frozen=True, slots=True)
class Handler:
    """One registered handler: `fn` runs for events of tables matching `pattern`."""

    name: str
    pattern: str
    fn: HandlerFn
    regex: re.Pattern[str] | None  # None for an exact table name

    def matches(self, table: str) -> bool:
        if self.regex is None:
            return table == self.pattern
        return self.regex.fullmatch(table) is not None


class HandlerRegistry:
    """Table pattern -> handlers, in registration order, with a per-table cache.

    Several handlers may match one table; the lanes run them concurrently on an event
    and the event is done when all of them are. Registration is meant to happen at load
    time, but it is safe at any time: it takes a lock and clears the cache.
    """

    def __init__(self) -> None:
        self._handlers: list[Handler] = []
        self._cache: dict[str, tuple[Handler, ...]] = {}
        self._lock = threading.Lock()

    def register(self, table_pattern: str, handler: HandlerFn, name: str | None = None) -> Handler:
        """Register `handler` for tables matching `table_pattern` (see the module docstring)."""
        if not callable(handler):
            raise TypeError(f"handler for pattern {table_pattern!r} is not callable: {handler!r}")
        registered = Handler(
            name=name if name is not None else _default_name(handler),
            pattern=table_pattern,
            fn=handler,
            regex=_compile(table_pattern),
        )
        with self._lock:
            self._handlers.append(registered)
            self._cache = {}
        return registered

    def handler(
        self, table_pattern: str, name: str | None = None
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Decorator form of `register`; returns the function unchanged."""

        def decorate(fn: HandlerFn) -> HandlerFn:
            self.register(table_pattern, fn, name)
            return fn

        return decorate

    def handlers_for(self, table: str) -> tuple[Handler, ...]:
        """Handlers for `table` ("db.table"), in registration order; empty when none match."""
        try:
            return self._cache[table]
        except KeyError:
            pass
        with self._lock:
            found = tuple(h for h in self._handlers if h.matches(table))
            self._cache[table] = found
        return found

    def __len__(self) -> int:
        return len(self._handlers)


def _compile(pattern: object) -> re.Pattern[str] | None:
    """None for an exact `db.table` name, else the compiled regex; errors name the pattern."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"handler table pattern must be a non-empty string, got {pattern!r}")
    if _EXACT_NAME.fullmatch(pattern):
        return None
    if _IDENTIFIER.fullmatch(pattern):
        raise ValueError(
            f"handler table pattern {pattern!r} has no database part: use 'db.table', "
            f"or a regex such as r'\\w+\\.{pattern}'"
        )
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(
            f"handler table pattern {pattern!r} is neither a 'db.table' name nor a valid "
            f"regular expression: {exc}"
        ) from exc


def _default_name(fn: HandlerFn) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__
