"""Converters between provider message formats and the engine's message model.

``messages_from_any`` is what the ingest API uses: callers post OpenAI,
Anthropic or AgentScope messages without saying which, and the shape tells.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from contextlab.engine.convert.agentscope import from_agentscope, to_agentscope
from contextlab.engine.convert.anthropic import from_anthropic, to_anthropic
from contextlab.engine.convert.openai import from_openai, to_openai
from contextlab.engine.core.errors import InvalidMessages
from contextlab.engine.core.messages import Message

MessageFormat = Literal["openai", "anthropic", "agentscope"]

__all__ = [
    "MessageFormat",
    "detect_message_format",
    "from_agentscope",
    "from_anthropic",
    "from_openai",
    "messages_from_any",
    "to_agentscope",
    "to_anthropic",
    "to_openai",
]

_EXPECTED = (
    "expected a list of OpenAI chat messages ({role, content, tool_calls?, tool_call_id?}), "
    "Anthropic messages ({role: user|assistant, content: [typed blocks]}) or AgentScope Msg dicts "
    "({id, name, role, content, metadata, timestamp})"
)
_OPENAI_PARTS = frozenset({"image_url", "input_audio", "refusal", "file"})
_ANTHROPIC_ONLY_BLOCKS = frozenset({"redacted_thinking", "document"})
_AGENTSCOPE_ONLY_BLOCKS = frozenset({"audio", "video"})


def _block_signals(block: dict[str, Any], found: dict[str, int], index: int) -> bool:
    """Record what one content item says about the format; True if it is a typed block."""
    kind = block.get("type")
    if not isinstance(kind, str):
        return False
    if kind in _OPENAI_PARTS and kind in block:
        found.setdefault("openai", index)
    if "tool_use_id" in block or kind in _ANTHROPIC_ONLY_BLOCKS or (kind == "thinking" and "signature" in block):
        found.setdefault("anthropic", index)
    if "output" in block or "raw_input" in block or kind in _AGENTSCOPE_ONLY_BLOCKS:
        found.setdefault("agentscope", index)
    if kind == "tool_result" and "id" in block and "tool_use_id" not in block:
        found.setdefault("agentscope", index)
    return True


def detect_message_format(messages: list[dict[str, Any]]) -> MessageFormat:
    """Tell OpenAI, Anthropic and AgentScope messages apart by their shape.

    Tool calls, tool roles or OpenAI part types mean OpenAI; ``tool_use_id``
    and Anthropic-only blocks mean Anthropic; ``output``/``raw_input`` blocks or
    the AgentScope envelope (name + role + timestamp/metadata) mean AgentScope.
    Typed blocks with nothing more specific are Anthropic; plain text is OpenAI.
    """
    if not isinstance(messages, list):
        raise InvalidMessages(f"messages must be a list; {_EXPECTED}", field="messages")
    found: dict[str, int] = {}  # format -> first message index that showed it
    typed_blocks = False
    non_text_blocks = False
    has_system = False
    for index, msg in enumerate(messages):
        if not isinstance(msg, dict) or "role" not in msg:
            raise InvalidMessages(f"messages[{index}] is not a message object with a role; {_EXPECTED}",
                                  field=f"messages[{index}]")
        role = msg.get("role")
        if role in ("tool", "developer") or "tool_calls" in msg or "tool_call_id" in msg:
            found.setdefault("openai", index)
        if "reasoning_content" in msg:
            found.setdefault("openai", index)
        if "name" in msg and ("timestamp" in msg or "metadata" in msg):
            found.setdefault("agentscope", index)
        if role == "system":
            has_system = True
        content = msg.get("content")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and _block_signals(block, found, index):
                    typed_blocks = True
                    if block.get("type") != "text":
                        non_text_blocks = True
    if len(found) > 1:
        seen = ", ".join(f"{fmt} (messages[{i}])" for fmt, i in sorted(found.items(), key=lambda kv: kv[1]))
        raise InvalidMessages(
            f"the messages mix formats: {seen}; send one format per request, {_EXPECTED}", field="messages"
        )
    if found:
        fmt = next(iter(found))
        return "openai" if fmt == "openai" else "anthropic" if fmt == "anthropic" else "agentscope"
    if typed_blocks:
        if not has_system:
            return "anthropic"
        # Anthropic has no system role in its messages, and OpenAI has no typed
        # blocks beyond text: system + tool_use/thinking blocks is AgentScope.
        return "agentscope" if non_text_blocks else "openai"
    return "openai"


def messages_from_any(
    messages: list[dict[str, Any]], *, known_calls: Mapping[str, str] | None = None
) -> list[Message]:
    """Detect the format of ``messages`` and convert them.

    ``known_calls`` (call id -> tool name) are calls made in earlier batches,
    so that results arriving in a later request are not taken for orphans.
    """
    fmt = detect_message_format(messages)
    if fmt == "anthropic":
        return from_anthropic(messages, known_calls=known_calls)
    if fmt == "agentscope":
        return from_agentscope(messages, known_calls=known_calls)
    return from_openai(messages, known_calls=known_calls)
