"""The exact payload of a turn, by layer, diffed against the previous turn's.

Payloads are stored in OpenAI's chat format, which carries no message ids, so
the messages are aligned by content with ``difflib.SequenceMatcher``; inside a
replaced stretch, messages with the same identity (role and tool call id, or
role and name) pair up as "changed" (a stage-2 cut, a new summary version).
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

LAYERS: tuple[str, ...] = ("system", "summary", "messages", "tool_results")
LAYER_LABELS: dict[str, str] = {"system": "system prompt", "summary": "summary", "messages": "kept messages",
                                "tool_results": "tool results", "tools": "tool schemas"}

Message = Mapping[str, Any]


def layer_of(message: Message) -> str:
    role = message.get("role")
    if role == "system":
        return "system"
    if message.get("name") == "summary":
        return "summary"
    if role == "tool":
        return "tool_results"
    return "messages"


def message_text(message: Message) -> str:
    """What a reader needs of one payload message: its text, then its tool calls."""
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                parts.append(str(part.get("text") or part.get("image_url") or part.get("type") or ""))
            else:
                parts.append(str(part))
        text = "\n".join(parts)
    else:
        text = ""
    calls = message.get("tool_calls") or []
    for call in calls:
        function = call.get("function") or {}
        text += ("\n" if text else "") + f"→ {function.get('name', '?')}({function.get('arguments', '')})"
    return text


def _fingerprint(message: Message) -> str:
    return json.dumps(message, sort_keys=True, ensure_ascii=False, default=str)


def _identity(message: Message) -> tuple[str, str]:
    role = str(message.get("role", ""))
    if message.get("tool_call_id"):
        return role, f"tool:{message['tool_call_id']}"
    calls = message.get("tool_calls") or []
    if calls:
        return role, f"calls:{calls[0].get('id', '')}"
    if message.get("name"):
        return role, f"name:{message['name']}"
    return role, ""


@dataclass(frozen=True, slots=True)
class Row:
    status: str  # same | added | removed | changed
    layer: str
    message: Message  # the current message (the previous one for "removed")
    index: int | None  # position in the current payload
    previous: Message | None = None  # the previous version, for "changed"
    previous_index: int | None = None


def diff_payloads(previous: Sequence[Message], current: Sequence[Message]) -> list[Row]:
    """Every message of ``current`` in order, with the removed ones of ``previous`` where they were."""
    old = [_fingerprint(m) for m in previous]
    new = [_fingerprint(m) for m in current]
    rows: list[Row] = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            rows.extend(Row("same", layer_of(current[j]), current[j], j, previous[i], i)
                        for i, j in zip(range(i1, i2), range(j1, j2), strict=True))
            continue
        # Pair by identity first (the same tool result re-cut, the summary re-written).
        unmatched_old = list(range(i1, i2))
        pairs: dict[int, int] = {}
        for j in range(j1, j2):
            key = _identity(current[j])
            for i in unmatched_old:
                # Plain messages have no identity: a new user message is never
                # "the same message, changed" of an old one.
                if key[1] and _identity(previous[i]) == key:
                    pairs[j] = i
                    unmatched_old.remove(i)
                    break
        removed = set(unmatched_old)
        for i in range(i1, i2):
            if i in removed:
                rows.append(Row("removed", layer_of(previous[i]), previous[i], None, None, i))
        for j in range(j1, j2):
            if j in pairs:
                i = pairs[j]
                rows.append(Row("changed", layer_of(current[j]), current[j], j, previous[i], i))
            else:
                rows.append(Row("added", layer_of(current[j]), current[j], j))
    return rows


def counts(rows: Sequence[Row]) -> dict[str, int]:
    tally = Counter(row.status for row in rows)
    return {status: tally.get(status, 0) for status in ("same", "added", "removed", "changed")}


def layer_chars(messages: Sequence[Message]) -> dict[str, int]:
    sizes = dict.fromkeys(LAYERS, 0)
    for message in messages:
        sizes[layer_of(message)] += len(message_text(message))
    return sizes
