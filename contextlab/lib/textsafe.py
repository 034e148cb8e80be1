"""Untrusted text (tool output, model replies) made fit for a page.

The templates escape everything; this module only removes what escaping cannot
make readable (terminal escape codes, other control characters) and splits
long outputs into a short head and the rest, so a page can collapse the rest
behind ``<details>``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from contextlab.engine.core.ansi import ANSI_ESCAPE as _ANSI
from contextlab.engine.core.unicode import repaired

# Control characters other than tab, newline and carriage return; shown as a
# visible placeholder so a reader knows something was there.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean(text: str) -> str:
    """``text`` without terminal escape codes; other control characters become '�'."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return _CONTROL.sub("\ufffd", text)


@dataclass(frozen=True, slots=True)
class Preview:
    head: str
    rest: str
    lines: int
    chars: int
    # True when ``rest`` was cut to keep the page small (the full text is
    # behind a link then).
    clipped: bool

    @property
    def collapsed(self) -> bool:
        return bool(self.rest)


def preview(text: str, *, head_lines: int = 12, head_chars: int = 1_500, max_chars: int = 60_000) -> Preview:
    """Split cleaned ``text`` into the first lines and the rest (at most ``max_chars`` in all)."""
    text = clean(text)
    total_lines = text.count("\n") + 1 if text else 0
    cut = len(text)
    newline = -1
    for _ in range(head_lines):
        newline = text.find("\n", newline + 1)
        if newline < 0:
            break
    if newline >= 0:
        cut = newline
    cut = min(cut, head_chars, max_chars)
    head, rest = text[:cut], text[cut:]
    clipped = len(text) > max_chars
    if clipped:
        rest = rest[: max(0, max_chars - len(head))]
    return Preview(head=head, rest=rest, lines=total_lines, chars=len(text), clipped=clipped)


def excerpt(text: str, limit: int = 240) -> str:
    """One line of cleaned text, at most ``limit`` characters."""
    flat = " ".join(clean(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# A JSON escape of a UTF-16 surrogate (\\uD800-\\uDFFF), or a surrogate character itself.
_MAY_HOLD_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")


class RepairingJSONDecoder(json.JSONDecoder):
    """Decodes JSON columns with every lone surrogate replaced by U+FFFD.

    A row stored before the boundaries refused them would otherwise make every
    page, list and export that reads it fail to encode its answer.
    """

    def decode(self, s: str, *args: Any, **kwargs: Any) -> Any:
        value = super().decode(s, *args, **kwargs)
        # A surrogate in the decoded value comes from an escape in the text (or a
        # raw one): one scan of the text spares walking every value of a clean
        # row, which is nearly all of them (a session's live messages on a cold load).
        if _MAY_HOLD_SURROGATE.search(s) is None:
            return value
        return repaired(value)
