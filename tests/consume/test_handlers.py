"""HandlerRegistry: exact names and regexes, registration order, the per-table cache, and
errors that name the bad pattern."""

from __future__ import annotations

import pytest

from binlog_assets.consume.handlers import HandlerRegistry


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
