from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

import pytest

from binlog_assets.formats.mysql_types import infer_type, infer_types, integer_type, mysql_type


@pytest.mark.parametrize(
    ("type_name", "canonical"),
    [
        ("int(11)", "int"),
        ("INTEGER", "int"),
        ("tinyint(1)", "int"),
        ("year", "int"),
        ("int(10) unsigned", "bigint"),
        ("INT UNSIGNED", "bigint"),
        ("bigint(20)", "bigint"),
        ("bigint(20) unsigned zerofill", "decimal(20,0)"),
        ("decimal(10,2)", "decimal(10,2)"),
        ("NUMERIC(65, 30)", "decimal(65,30)"),
        ("decimal", "decimal(10,0)"),
        ("float", "float"),
        ("double precision", "double"),
        ("REAL", "double"),
        ("date", "date"),
        ("datetime(6)", "timestamp"),
        ("TIMESTAMP", "timestamp"),
        ("VARCHAR(255)", "string"),
        ("enum('a','b,c')", "string"),
        ("time(3)", "string"),
        ("json", "json"),
        ("varbinary(16)", "binary"),
        ("longblob", "binary"),
        ("bit(1)", None),
        ("geometry", None),
        ("", None),
    ],
)
def test_canonical_type(type_name, canonical):
    assert mysql_type(type_name).canonical == canonical


def test_decimal_digits_from_separate_precision_and_scale():
    assert mysql_type("DECIMAL", 12, 4).canonical == "decimal(12,4)"
    assert mysql_type("decimal(8,1)", 12, 4).canonical == "decimal(8,1)"


@pytest.mark.parametrize(
    ("type_name", "text", "value"),
    [
        ("bigint unsigned", "18446744073709551615", 18446744073709551615),
        ("decimal(30,10)", "12345678901234567890.0123456789",
         Decimal("12345678901234567890.0123456789")),
        ("double", "-1.5e3", -1500.0),
        ("date", "2020-02-29", date(2020, 2, 29)),
        ("date", "0000-00-00", None),
        ("datetime(6)", "2020-05-13 12:34:56.000001", datetime(2020, 5, 13, 12, 34, 56, 1)),
        ("timestamp", "0000-00-00 00:00:00", None),
        ("blob", "\x00\xff", b"\x00\xff"),
        ("varchar(3)", "abc", "abc"),
    ],
)
def test_text_values_parse_to_python_values(type_name, text, value):
    assert mysql_type(type_name).parse(text) == value


@pytest.mark.parametrize(("type_name", "text"), [("int", "1.5"), ("date", "2020-02-30"),
                                                  ("decimal(4,2)", "abc")])
def test_text_that_does_not_fit_its_type_raises(type_name, text):
    with pytest.raises((ValueError, ArithmeticError)):
        mysql_type(type_name).parse(text)


@pytest.mark.parametrize(
    ("value", "canonical"),
    [
        (Decimal("123456789012345678.91"), "decimal(38,18)"),
        (Decimal("1E-7"), "decimal(38,18)"),
        # Past what decimal(38,18) holds, a value gets a type of its own digits.
        (Decimal("123456789012345678901234567890"), "decimal(30,0)"),
        (Decimal("0.0000000000000000000001"), "decimal(22,22)"),
    ],
)
def test_an_undeclared_decimal_gets_a_type_that_holds_it(value, canonical):
    assert infer_type(value) == canonical


@pytest.mark.parametrize(
    ("value", "canonical"),
    [(2**63 - 1, "bigint"), (-(2**63), "bigint"),
     # A BIGINT UNSIGNED above 2^63 is no long: it never wraps to a negative number.
     (18446744073709551351, "decimal(20,0)"), (-(2**63) - 1, "decimal(20,0)"),
     (10**25, "decimal(26,0)")],
)
def test_an_undeclared_integer_out_of_the_long_range_is_a_decimal(value, canonical):
    assert infer_type(value) == canonical


def test_a_declared_integer_type_widens_for_a_value_out_of_its_range():
    assert integer_type(2**31 - 1) == "int"
    assert integer_type(4294967295) == "bigint"
    assert integer_type(7, "bigint") == "bigint"
    assert integer_type(18446744073709551351, "bigint") == "decimal(20,0)"


class _Text(str):
    """A str subclass: no class shortcut applies, the general rule must."""


def test_image_types_are_infer_type_of_each_first_non_null_value():
    """`infer_types` (the consume path's shortcut) answers as `infer_type` value by
    value: the before-image's type first, nulls skipped, declared columns left out."""
    before = {"id": 1, "big": 2**63, "neg": -(2**63) - 1, "ok": True, "f": 1.5,
              "d": Decimal("1.25"), "when": datetime(2020, 1, 2, 3, 4, 5),
              "day": datetime(2020, 1, 2).date(), "b": b"\x00", "ba": bytearray(b"x"),
              "j": {"a": 1}, "l": [1], "s": "x", "t": _Text("y"), "late": None,
              "declared": 7}
    after = {**before, "id": 2**70, "late": Decimal("10.5"), "new": 3}
    declared = {"declared": "int"}
    expected = {c: infer_type(v) for c, v in before.items()
                if v is not None and c not in declared}
    expected["late"] = infer_type(after["late"])
    expected["new"] = "bigint"
    found = infer_types((before, after), declared)
    assert found == expected
    assert list(found) == list(expected)  # column order as first seen
    assert found["big"] == "decimal(20,0)" and found["t"] == "string"
    assert infer_types((None, {"declared": 1}), declared) == {}
    assert infer_types((None, {"a": None}), None) == {}
