"""Stored content blocks read as plain text.

A message's content is stored as a list of blocks (text, thinking, tool call,
tool output). The screens, the search and the loss check all need the words a
reader would see in it; this is the one place that says what those are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def first_text(blocks: Iterable[Mapping[str, Any]] | None) -> str:
    """The readable text of stored content blocks (text, tool input, tool output)."""
    parts: list[str] = []
    for block in blocks or []:
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "thinking":
            parts.append(str(block.get("thinking", "")))
        elif kind == "tool_use":
            parts.append(f"→ {block.get('name', '')}("
                         + str(block.get("raw_input") or json.dumps(block.get("input", {}), ensure_ascii=False))
                         + ")")
        elif kind == "tool_result":
            output = block.get("output", "")
            parts.append(output if isinstance(output, str) else "\n".join(
                str(p.get("text", "")) for p in output if isinstance(p, dict) and p.get("type") == "text"))
        else:
            parts.append(f"[{kind}]")
    return "\n".join(p for p in parts if p)
