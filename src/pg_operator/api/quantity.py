"""Kubernetes resource quantities ("250m", "1Gi", "2") as exact numbers, for comparisons only."""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction
from typing import Annotated

from pydantic import BeforeValidator, StringConstraints, WithJsonSchema

# Decimal numbers with an optional binary or decimal SI suffix; exponent forms ("1e3") are not accepted.
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)


def _int_to_str(value: object) -> object:
    # Kubernetes accepts `cpu: 2` as well as `cpu: "2"`; keep one representation.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


# A quantity field of the API: an integer or a string in the schema, held as the string.
Quantity = Annotated[
    str,
    BeforeValidator(_int_to_str),
    StringConstraints(pattern=QUANTITY_PATTERN, max_length=32),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "maxLength": 32,
        }
    ),
]

# Any quantity the API server may render (signs, exponents, n/u suffixes), for comparing what it stored
# with what we asked for; user input is held to QUANTITY_PATTERN by the schema.
_ANY_QUANTITY_RE = re.compile(
    r"^([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:[eE]([+-]?[0-9]+))?"
    r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$"
)

_SUFFIX: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


def parse_quantity(value: str | int) -> Fraction:
    """The exact value of a quantity; ValueError when it is not one."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    match = _ANY_QUANTITY_RE.match(value.strip())
    if match is None:
        raise ValueError(f"not a quantity: {value!r}")
    number = Fraction(Decimal(match.group(1)))
    if match.group(2):
        number *= Fraction(10) ** int(match.group(2))
    return number * _SUFFIX[match.group(3) or ""]
