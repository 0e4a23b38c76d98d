"""Which handlers apply a table's change events: the `HandlerRegistry`.

A handler is a callable taking one `ChangeEvent` (or, registered with `batch=True`, a
list of them: consecutive events of one ordering key, in order). A handler object may
also have `open()` and `close()`: the run opens every registered object once before its
first event and closes it after its last (`HandlerRegistry.opened`), so a client to a
server lives as long as the run, with no global. It is registered for a table pattern:
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
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from binlog_assets.formats.event import ChangeEvent

HandlerFn = Callable[[ChangeEvent], None]
BatchHandlerFn = Callable[[Sequence[ChangeEvent]], None]

_EXACT_NAME = re.compile(r"[\w$]+\.[\w$]+")
_IDENTIFIER = re.compile(r"[\w$]+")


@dataclass(frozen=True, slots=True)
class Handler:
    """One registered handler: `fn` runs for events of tables matching `pattern`."""

    name: str
    pattern: str
    fn: HandlerFn | BatchHandlerFn
    regex: re.Pattern[str] | None  # None for an exact table name
    batch: bool = False  # `fn` takes a list of events of one ordering key

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
        self._open_count = 0
        self._closing: ExitStack | None = None

    def register(self, table_pattern: str, handler: HandlerFn | BatchHandlerFn,
                 name: str | None = None, *, batch: bool = False) -> Handler:
        """Register `handler` for tables matching `table_pattern` (see the module docstring).
        With `batch=True` it receives a list of consecutive events of one ordering key."""
        if not callable(handler):
            raise TypeError(f"handler for pattern {table_pattern!r} is not callable: {handler!r}")
        for hook in ("open", "close"):
            if hasattr(handler, hook) and not callable(getattr(handler, hook)):
                raise TypeError(f"handler for pattern {table_pattern!r}: its {hook!r} "
                                f"attribute is not a method")
        registered = Handler(
            name=name if name is not None else _default_name(handler),
            pattern=table_pattern,
            fn=handler,
            regex=_compile(table_pattern),
            batch=bool(batch),
        )
        with self._lock:
            self._handlers.append(registered)
            self._cache = {}
        return registered

    def handler(
        self, table_pattern: str, name: str | None = None, *, batch: bool = False
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Decorator form of `register`; returns the function unchanged."""

        def decorate(fn: HandlerFn) -> HandlerFn:
            self.register(table_pattern, fn, name, batch=batch)
            return fn

        return decorate

    @property
    def patterns(self) -> tuple[str, ...]:
        """Every registered table pattern, in registration order (for config checks)."""
        return tuple(h.pattern for h in self._handlers)

    @contextmanager
    def opened(self) -> Iterator[HandlerRegistry]:
        """Open every handler object that has `open()` (each once, in registration order)
        and close them in reverse order on exit, also when the run fails. Nested uses
        share one opening, so a run over several partitions opens its clients once."""
        with self._lock:
            first = self._open_count == 0
            self._open_count += 1
            if first:
                try:
                    self._closing = _open_all(self._handlers)
                except BaseException:
                    self._open_count -= 1
                    raise
        try:
            yield self
        finally:
            with self._lock:
                self._open_count -= 1
                closing = self._closing if self._open_count == 0 else None
                if closing is not None:
                    self._closing = None
            if closing is not None:
                closing.close()

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


def _open_all(handlers: Sequence[Handler]) -> ExitStack:
    """Open each distinct handler object; the stack closes those opened, last first. An
    `open()` that fails closes the ones before it and names the handler."""
    stack = ExitStack()
    seen: set[int] = set()
    try:
        for h in handlers:
            if id(h.fn) in seen:
                continue
            seen.add(id(h.fn))
            if callable(getattr(h.fn, "open", None)):
                try:
                    h.fn.open()
                except Exception as exc:
                    raise HandlerOpenError(f"handler {h.name!r} ({h.pattern}): open() "
                                           f"failed: {type(exc).__name__}: {exc}") from exc
            if callable(getattr(h.fn, "close", None)):
                stack.callback(h.fn.close)
    except BaseException:
        stack.close()
        raise
    return stack


class HandlerOpenError(RuntimeError):
    """A handler's `open()` failed: the run stops before it reads a record."""


def _default_name(fn: object) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def load_registry(spec: str | None) -> HandlerRegistry:
    """The registry `package.module:attribute` names (an empty one for None). Each
    failure says which part of the spec is wrong."""
    import importlib

    if not spec:
        return HandlerRegistry()
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r}: expected 'package.module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(f"{spec!r}: no module {exc.name!r} to import") from exc
    if not hasattr(module, attr):
        raise ValueError(f"{spec!r}: module {module_name!r} has no attribute {attr!r}")
    registry = getattr(module, attr)
    if not isinstance(registry, HandlerRegistry):
        raise ValueError(f"{spec!r} is a {type(registry).__name__}, not a HandlerRegistry")
    return registry


def pattern_covers(handler_pattern: str, table_source: str) -> bool:
    """Whether a handler pattern can match a table that a `tables[].source` names.

    Both are read the same way (exact name or regex). Two regexes cannot be compared in
    general, so they must be spelled alike."""
    handler_regex, table_regex = _compile(handler_pattern), _compile(table_source)
    if table_regex is None:
        return (handler_pattern == table_source if handler_regex is None
                else handler_regex.fullmatch(table_source) is not None)
    if handler_regex is None:
        return table_regex.fullmatch(handler_pattern) is not None
    return handler_pattern == table_source
