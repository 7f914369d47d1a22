"""Kubernetes quantities parse exactly, round up like the API server, and fail clearly."""

from __future__ import annotations

import pytest

from strata.operator.api import QuantityError, format_size, parse_milli, parse_quantity, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        (1024, 1024),
        ("1Ki", 1024),
        ("8Gi", 8 * 2**30),
        ("1.5Gi", 3 * 2**29),
        ("2Ti", 2 * 2**40),
        ("1k", 1000),
        ("500M", 500_000_000),
        ("1.5G", 1_500_000_000),
        ("3T", 3 * 10**12),
        ("1e3", 1000),
        ("5E-1", 1),  # 0.5 rounds up, as Quantity.Value() does
        ("1500m", 2),
        (".5Ki", 512),
        ("1.", 1),
    ],
)
def test_parse_quantity(text: str | int, expected: int) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("500m", 500), ("2", 2000), ("0.1", 100), ("1.5", 1500), (3, 3000)]
)
def test_parse_milli(text: str | int, expected: int) -> None:
    assert parse_milli(text) == expected


@pytest.mark.parametrize(
    "bad", ["", "abc", "8GB", "8 Gi", " 8Gi", "-1Gi", "1.2.3", "Gi", "8gi", "0x10", "1e"]
)
def test_bad_quantities_are_refused_with_the_value_in_the_message(bad: str) -> None:
    with pytest.raises(QuantityError, match="is not a quantity"):
        parse_quantity(bad)


def test_wrong_types_and_negative_integers_are_refused() -> None:
    with pytest.raises(QuantityError, match="negative"):
        parse_quantity(-5)
    with pytest.raises(QuantityError, match="boolean"):
        parse_quantity(True)
    with pytest.raises(QuantityError, match="float"):
        parse_quantity(1.5)  # type: ignore[arg-type]


def test_sizes_refuse_the_milli_suffix() -> None:
    assert parse_size("8Gi") == 8 * 2**30
    with pytest.raises(QuantityError, match="milli"):
        parse_size("500m")


@pytest.mark.parametrize(
    ("size", "text"),
    [(8 * 2**30, "8Gi"), (3072, "3Ki"), (1536, "1536"), (1000, "1000"), (0, "0"), (2**40, "1Ti")],
)
def test_format_size_round_trips(size: int, text: str) -> None:
    assert format_size(size) == text
    assert parse_size(text) == size
