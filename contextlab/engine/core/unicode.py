"""Text that cannot be written as UTF-8: found with the field it sits in, or repaired.

JSON may spell a lone UTF-16 surrogate (``"\\ud800"``); Python decodes it into a
``str`` that no UTF-8 encoder accepts, so one such character would break every
page, file and export that shows it. Boundaries either refuse it, naming the
field (``first_unencodable``), or replace it with U+FFFD (``repaired``).
"""

from __future__ import annotations

import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> bool:
    """True when ``text`` can be written as UTF-8 (holds no lone surrogate)."""
    return _SURROGATE.search(text) is None


def repaired_text(text: str) -> str:
    """``text`` with valid surrogate pairs joined and every lone surrogate replaced by U+FFFD."""
    if encodable(text):
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def repaired(value: Any) -> Any:
    """``value`` (decoded JSON) with every string, keys included, repaired; unchanged values are not copied."""
    if isinstance(value, str):
        return repaired_text(value)
    if isinstance(value, list):
        items = [repaired(item) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if isinstance(value, dict):
        pairs = [(repaired_text(k) if isinstance(k, str) else k, repaired(v)) for k, v in value.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(pairs, value.items(), strict=True)):
            return value
        return dict(pairs)
    return value


def first_unencodable(value: Any, path: str = "") -> str | None:
    """The dotted path (``messages[0].name``) of the first string that is not valid UTF-8 text, else None.

    Iterative, so a deeply nested value cannot exhaust the stack.
    """
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if not encodable(item):
                return where or "body"
        elif isinstance(item, dict):
            children: list[tuple[Any, str]] = []
            for key, child in item.items():
                child_path = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and not encodable(key):
                    return where or "body"
                children.append((child, child_path))
            stack.extend(reversed(children))
        elif isinstance(item, list):
            stack.extend(reversed([(child, f"{where}[{index}]") for index, child in enumerate(item)]))
    return None


def holds_nul(value: Any) -> bool:
    """True when a string (key or value) anywhere inside ``value`` holds a NUL character.

    Valid JSON and valid UTF-8, but PostgreSQL text and JSON columns cannot store it.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
