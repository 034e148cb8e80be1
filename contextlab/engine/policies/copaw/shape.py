"""Messages in the shape CoPaw's functions take: AgentScope ``Msg`` dicts.

Shared by the ``copaw`` policy, which runs CoPaw's code on them, and by the
``contextlab`` policy, which runs CoPaw's split beside its own to name what
CoPaw would have lost.
"""

from __future__ import annotations

from typing import Any

from contextlab.engine.core.messages import (
    MediaBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    parse_timestamp,
)


def as_agentscope(msg: Message) -> dict[str, Any]:
    """A message as an AgentScope ``Msg`` dict, the shape CoPaw's functions take."""
    blocks: list[dict[str, Any]] = []
    for block in msg.content:
        if isinstance(block, TextBlock):
            blocks.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolUseBlock):
            use: dict[str, Any] = {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
            if block.raw_input is not None:
                use["raw_input"] = block.raw_input
            blocks.append(use)
        elif isinstance(block, ToolResultBlock):
            output: Any = block.output
            if not isinstance(block.output, str):
                parts: list[dict[str, Any]] = []
                for part in block.output:
                    if isinstance(part, TextBlock):
                        parts.append({"type": "text", "text": part.text})
                    else:
                        parts.append({"type": part.kind, "source": {"type": "url", "url": part.url or ""}})
                output = parts
            blocks.append({"type": "tool_result", "id": block.id, "name": block.name, "output": output})
        elif isinstance(block, MediaBlock):
            blocks.append({"type": block.kind, "source": {"type": "url", "url": block.url or ""}})
        else:
            blocks.append({"type": "thinking", "thinking": block.thinking})
    role = "system" if msg.role == "tool" else msg.role
    return {"id": msg.id, "name": msg.name or role, "role": role, "content": blocks,
            "metadata": {}, "timestamp": local_timestamp(msg)}


def agentscope_output(content: Any, tool_id: str) -> str | None:
    if not isinstance(content, list):
        return None
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_result" and block.get("id") == tool_id:
            out = block.get("output")
            if isinstance(out, str):
                return out
            if isinstance(out, list):
                return "\n".join(p.get("text", "") for p in out if isinstance(p, dict) and p.get("type") == "text")
    return None


def local_timestamp(msg: Message) -> str:
    """AgentScope stamps messages in process-local time, ``YYYY-MM-DD HH:MM:SS.mmm``."""
    local = parse_timestamp(msg.timestamp).astimezone()
    return local.strftime("%Y-%m-%d %H:%M:%S.") + f"{local.microsecond // 1000:03d}"


def local_date(msg: Message) -> str:
    return local_timestamp(msg)[:10]
