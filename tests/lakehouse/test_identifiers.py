"""Quoting of names from events: what Spark's parser receives is one identifier."""

from __future__ import annotations

import pytest

from binlog_assets.identifiers import (
    UnsafeIdentifierError,
    check_column,
    qualified,
    quote,
)


@pytest.mark.parametrize(("name", "quoted"), [
    ("plain", "`plain`"),
    ("a`b", "`a``b`"),
    ("x`; DROP TABLE t; --", "`x``; DROP TABLE t; --`"),
    ("it's \"quoted\"", "`it's \"quoted\"`"),
])
def test_quote_doubles_backticks(name: str, quoted: str) -> None:
    assert quote(name) == quoted


def test_qualified_quotes_each_part() -> None:
    assert qualified("db", "t`x") == "`db`.`t``x`"


def test_check_column_passes_odd_but_harmless_names() -> None:
    for name in ("a`b", "c;d", "e'f", 'g"h', "sp ace", "dot.ted", "ünï"):
        assert check_column(name, "t") == name


@pytest.mark.parametrize("name", ["", None, 5, "tab\there", "nul\x00", "_op", "_Applied_At"])
def test_check_column_refuses_with_the_table_named(name) -> None:
    with pytest.raises(UnsafeIdentifierError, match="'db.t'"):
        check_column(name, "db.t")
