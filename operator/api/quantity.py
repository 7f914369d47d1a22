"""Kubernetes resource quantities ("8Gi", "500m", "1.5G", 1024) as exact integers.

The API stores sizes as Kubernetes quantities so tenants write what they write everywhere else
in Kubernetes; the operator and the tier-limit check need plain integers (bytes, millicores).
Parsing is exact (``Fraction``), and rounds up like the API server's ``Quantity.Value()``.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_MILLI = Fraction(1, 1000)

_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
# The API server's quantity grammar, minus the sign: no size or CPU count in the API is negative.
QUANTITY_PATTERN = rf"^{_NUMBER}(?:[KMGTPE]i|[mkMGTPE]|[eE][+-]?[0-9]+)?$"
# Sizes in bytes: a milli-byte means nothing, so the `m` suffix is refused.
SIZE_PATTERN = rf"^{_NUMBER}(?:[KMGTPE]i|[kMGTPE])?$"

_PARSE = re.compile(rf"^(?P<number>{_NUMBER})(?P<suffix>[KMGTPE]i|[mkMGTPE]|[eE][+-]?[0-9]+)?$")


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message says which value and why."""


def quantity_fraction(value: str | int) -> Fraction:
    """The exact value of a non-negative quantity, as a fraction."""
    if isinstance(value, bool):
        raise QuantityError(f"expected a quantity such as '8Gi' or an integer, got the boolean {value}")
    if isinstance(value, int):
        if value < 0:
            raise QuantityError(f"quantity {value} is negative")
        return Fraction(value)
    if not isinstance(value, str):
        raise QuantityError(f"expected a quantity such as '8Gi' or an integer, got {type(value).__name__}")
    match = _PARSE.match(value)
    if match is None:
        raise QuantityError(
            f"{value!r} is not a quantity: expected a number with an optional suffix "
            "Ki Mi Gi Ti Pi Ei, k M G T P E or m (e.g. '8Gi', '500m', '1.5G')"
        )
    return Fraction(match["number"]) * _multiplier(match["suffix"] or "")


def _multiplier(suffix: str) -> Fraction:
    if suffix in _BINARY:
        return Fraction(_BINARY[suffix])
    if suffix in _DECIMAL:
        return Fraction(_DECIMAL[suffix])
    if suffix == "m":
        return _MILLI
    return Fraction(10) ** int(suffix[1:])  # exponent form: 1e3, 5E-1


def parse_quantity(value: str | int) -> int:
    """Bytes (or units) of a quantity, rounded up as Kubernetes does: ``"8Gi"`` -> 8589934592."""
    return math.ceil(quantity_fraction(value))


def parse_size(value: str | int) -> int:
    """Bytes of a size quantity; refuses the milli suffix, which makes no sense for bytes."""
    if isinstance(value, str) and value.endswith("m"):
        raise QuantityError(f"{value!r} is not a size: the 'm' (milli) suffix does not apply to bytes")
    return parse_quantity(value)


def parse_milli(value: str | int) -> int:
    """Thousandths of a quantity, rounded up, for CPU: ``"500m"`` -> 500, ``"2"`` -> 2000."""
    return math.ceil(quantity_fraction(value) * 1000)


def format_size(size_bytes: int) -> str:
    """The shortest exact binary-suffix form of a byte count: 8589934592 -> ``"8Gi"``."""
    for suffix, factor in sorted(_BINARY.items(), key=lambda item: -item[1]):
        if size_bytes and size_bytes % factor == 0:
            return f"{size_bytes // factor}{suffix}"
    return str(size_bytes)
