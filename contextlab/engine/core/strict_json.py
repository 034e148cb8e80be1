"""JSON parsed by the rules of a body that will be stored and sent on.

Python's ``json`` module reads ``Infinity``, ``-Infinity`` and ``NaN`` (no JSON
spelling) and turns a number too large for a double (``1e400``) into
infinity; written back, each becomes the invalid token ``Infinity`` or ``NaN``,
which a provider refuses and a JSON column will not store. ``loads`` refuses
them, naming where the first one sits (``NonFiniteNumber.path``).

Lone surrogates are the other half of the same rule; see
``contextlab.engine.core.unicode`` (``repaired`` / ``first_unencodable``).
"""

from __future__ import annotations

import json
import math
from typing import Any


class NonFiniteNumber(ValueError):
    """A number JSON cannot carry: a spelled constant, or one past the range of a double."""

    def __init__(self, token: str, path: str) -> None:
        self.token = token
        self.path = path
        super().__init__(f"{path} is {token}: JSON numbers are finite and fit a double "
                         "(no Infinity, NaN or values beyond ±1.8e308)")


def loads(data: str | bytes) -> Any:
    """``json.loads`` refusing ``Infinity``, ``NaN`` and overflowing numbers (``NonFiniteNumber``)."""
    found: list[str] = []

    def constant(name: str) -> float:
        found.append(name)
        return float(name)

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            found.append(text if len(text) <= 40 else text[:37] + "...")
        return value

    value = json.loads(data, parse_constant=constant, parse_float=number)
    if found:
        raise NonFiniteNumber(found[0], first_non_finite(value) or "body")
    return value


def first_non_finite(value: Any, path: str = "") -> str | None:
    """The dotted path (``messages[0].temperature``) of the first infinite or NaN float, else None.

    Iterative, so a deeply nested value cannot exhaust the stack.
    """
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return where or "body"
        elif isinstance(item, dict):
            stack.extend(reversed([(child, f"{where}.{key}" if where else str(key)) for key, child in item.items()]))
        elif isinstance(item, list):
            stack.extend(reversed([(child, f"{where}[{index}]") for index, child in enumerate(item)]))
    return None
