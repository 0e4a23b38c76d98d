"""HandlerRegistry: exact names and regexes, registration order, the per-table cache, and
errors that name the bad pattern."""

from __future__ import annotations

import re

import pytest

from binlog_assets.consume.handlers import (
    HandlerOpenError,
    HandlerRegistry,
    load_registry,
    pattern_covers,
)


def noop(event) -> None:
    return None


def other(event) -> None:
    return None


def test_exact_name_matches_only_that_table() -> None:
    registry = HandlerRegistry()
    handler = registry.register("shop.orders", noop)
    assert handler.regex is None
    assert registry.handlers_for("shop.orders") == (handler,)
    # The dot of an exact name is literal, not "any character".
    assert registry.handlers_for("shopXorders") == ()
    assert registry.handlers_for("shop.orders_1") == ()


def test_dollar_is_part_of_an_exact_name() -> None:
    registry = HandlerRegistry()
    registry.register("erp.gl$lines", noop)
    assert len(registry.handlers_for("erp.gl$lines")) == 1
    assert registry.handlers_for("erp.gl") == ()


def test_regex_is_matched_against_the_whole_name() -> None:
    registry = HandlerRegistry()
    handler = registry.register(r"shop_\d+\.orders_\d+", noop)
    assert registry.handlers_for("shop_1.orders_07") == (handler,)
    assert registry.handlers_for("shop_1.orders_07_archive") == ()
    assert registry.handlers_for("xshop_1.orders_07") == ()


def test_several_handlers_in_registration_order() -> None:
    registry = HandlerRegistry()
    first = registry.register(r"shop\..*", noop, name="audit")
    second = registry.register("shop.orders", other, name="replica")
    assert registry.handlers_for("shop.orders") == (first, second)
    assert [h.name for h in registry.handlers_for("shop.users")] == ["audit"]
    assert len(registry) == 2


def test_cache_is_dropped_on_register() -> None:
    registry = HandlerRegistry()
    registry.register("shop.orders", noop)
    assert len(registry.handlers_for("shop.orders")) == 1
    registry.register(r".*\.orders", other)
    assert [h.fn for h in registry.handlers_for("shop.orders")] == [noop, other]


def test_decorator_registers_and_returns_the_function() -> None:
    registry = HandlerRegistry()

    @registry.handler("db.t", name="apply")
    def apply(event) -> None:
        return None

    @registry.handler("db.t")
    def audit(event) -> None:
        return None

    handlers = registry.handlers_for("db.t")
    assert [h.fn for h in handlers] == [apply, audit]
    assert [h.name for h in handlers] == ["apply", audit.__qualname__]


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("shop_(\\d+\\.orders", "'shop_(\\\\d+\\\\.orders' is neither"),
        ("orders", "'orders' has no database part"),
        ("", "non-empty string"),
        (None, "non-empty string"),
    ],
)
def test_bad_patterns_fail_at_registration_naming_the_pattern(pattern, message) -> None:
    registry = HandlerRegistry()
    with pytest.raises(ValueError) as raised:
        registry.register(pattern, noop)
    assert message in str(raised.value)
    assert len(registry) == 0


def test_handler_must_be_callable() -> None:
    with pytest.raises(TypeError, match="'db.t' is not callable"):
        HandlerRegistry().register("db.t", "not a function")  # type: ignore[arg-type]


class Client:
    """A handler object with a per-run client, recording its calls in `log`."""

    def __init__(self, name: str, log: list[str], fail_open: bool = False) -> None:
        self.name, self.log, self.fail_open = name, log, fail_open

    def open(self) -> None:
        if self.fail_open:
            raise ConnectionError("refused")
        self.log.append(f"open {self.name}")

    def close(self) -> None:
        self.log.append(f"close {self.name}")

    def __call__(self, event) -> None:
        self.log.append(f"handle {self.name}")


def test_opened_opens_each_object_once_and_closes_in_reverse() -> None:
    log: list[str] = []
    registry = HandlerRegistry()
    a, b = Client("a", log), Client("b", log)
    registry.register("db.t", a)
    registry.register("db.u", b)
    registry.register("db.v", a)  # one object, two patterns: one client
    registry.register("db.w", noop)  # a plain function has no lifecycle
    with registry.opened():
        # A run over several partitions nests: the clients stay open, once.
        with registry.opened():
            pass
        assert log == ["open a", "open b"]
    assert log == ["open a", "open b", "close b", "close a"]
    # The next run opens them again.
    with registry.opened():
        pass
    assert log[4:] == ["open a", "open b", "close b", "close a"]


def test_a_failed_open_closes_what_opened_and_names_the_handler() -> None:
    log: list[str] = []
    registry = HandlerRegistry()
    registry.register("db.t", Client("a", log))
    registry.register("db.u", Client("b", log, fail_open=True), name="search-index")
    with pytest.raises(HandlerOpenError, match="'search-index' \\(db.u\\).*ConnectionError"), \
            registry.opened():
        pass
    assert log == ["open a", "close a"]
    # Nothing is left half-open: the next run opens afresh.
    registry2 = HandlerRegistry()
    registry2.register("db.t", Client("c", log))
    with registry2.opened():
        pass
    assert log[-2:] == ["open c", "close c"]


def test_close_runs_when_the_run_fails() -> None:
    log: list[str] = []
    registry = HandlerRegistry()
    registry.register("db.t", Client("a", log))
    with pytest.raises(RuntimeError, match="boom"), registry.opened():
        raise RuntimeError("boom")
    assert log == ["open a", "close a"]


def test_batch_flag_is_kept() -> None:
    registry = HandlerRegistry()

    @registry.handler("db.t", batch=True)
    def many(events) -> None:
        return None

    assert registry.handlers_for("db.t")[0].batch is True
    assert registry.register("db.u", noop).batch is False


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tests.consume.test_handlers", "expected 'package.module:attribute'"),
        ("no_such_module_xyz:registry", "no module 'no_such_module_xyz'"),
        ("tests.consume.test_handlers:missing", "has no attribute 'missing'"),
        ("tests.consume.test_handlers:noop", "is a function, not a HandlerRegistry"),
    ],
)
def test_load_registry_says_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        load_registry(spec)


MODULE_REGISTRY = HandlerRegistry()


def test_load_registry_returns_the_named_object() -> None:
    assert load_registry(f"{__name__}:MODULE_REGISTRY") is MODULE_REGISTRY
    assert len(load_registry(None)) == 0


@pytest.mark.parametrize(
    ("handler", "table", "covers"),
    [
        ("shop.customers", "shop.customers", True),
        ("shop.customers", "shop.products", False),
        ("shop_1.orders", r"shop_\d+\.orders", True),  # a shard of a sharded table
        (r"shop_\d+\.orders", "shop_1.orders", True),
        (r"shop_\d+\.orders", r"shop_\d+\.orders", True),
        (r"shop_[0-9]+\.orders", r"shop_\d+\.orders", False),  # not comparable: spell alike
        (r".*", "shop.customers", True),
    ],
)
def test_pattern_covers(handler: str, table: str, covers: bool) -> None:
    assert pattern_covers(handler, table) is covers
