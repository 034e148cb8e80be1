"""flowllm / ReMe ``Message`` lists (one JSON array, whatever the file is called).

Close to OpenAI, with differences: tool calls are flat (``name`` and
``arguments`` next to ``id``, plus ``index`` and schema fields), every message
carries ``reasoning_content``, ``tool_calls`` and ``tool_call_id`` even when
they are empty, and ``time_created`` is a naive local time (taken as UTC, the
original kept in metadata). ReMe's own ``metadata`` dict is kept as
``metadata["reme"]``.
"""

from __future__ import annotations

from typing import Any

from contextlab.engine.convert.agentscope import normalise_timestamp
from contextlab.engine.importers._common import Source, Timeline, Transcript, finish_transcript
from contextlab.engine.importers.message_list import OpenAIRecord, convert_openai_records

FORMAT = "reme_list"
_CALL_KEYS = ("id", "type", "name", "arguments")


def _is_flat_call(call: Any) -> bool:
    return isinstance(call, dict) and "name" in call and "function" not in call


def matches(source: Source) -> bool:
    value = source.value
    if source.kind != "json" or not isinstance(value, list) or not value:
        return False
    if not all(isinstance(m, dict) and "role" in m for m in value):
        return False
    return any(
        "time_created" in m
        or (isinstance(m.get("tool_calls"), list) and any(_is_flat_call(c) for c in m["tool_calls"]))
        for m in value
    )


def _record(index: int, item: Any) -> OpenAIRecord:
    if not isinstance(item, dict):
        return OpenAIRecord(index, item)
    role = item.get("role")
    chat: dict[str, Any] = {"role": role, "content": item.get("content")}
    if item.get("name"):
        chat["name"] = item["name"]
    own: dict[str, Any] = {}
    if role == "assistant":
        if item.get("reasoning_content"):
            chat["reasoning_content"] = item["reasoning_content"]
        calls = item.get("tool_calls") or []
        if not isinstance(calls, list):
            chat["tool_calls"] = calls  # the converter names the bad field
        elif calls:
            chat["tool_calls"] = []
            extras: dict[str, Any] = {}
            for call in calls:
                if _is_flat_call(call):
                    chat["tool_calls"].append(
                        {
                            "id": call.get("id"),
                            "type": call.get("type") or "function",
                            "function": {"name": call.get("name"), "arguments": call.get("arguments", "")},
                        }
                    )
                    rest = {k: v for k, v in call.items() if k not in _CALL_KEYS and v not in ("", {}, [], None)}
                    if rest:
                        extras[str(call.get("id"))] = rest
                else:
                    chat["tool_calls"].append(call)
            if extras:
                own["tool_call_extras"] = extras
    if role == "tool":
        chat["tool_call_id"] = item.get("tool_call_id")
    if item.get("metadata"):
        own["metadata"] = item["metadata"]
    raw_time = item.get("time_created")
    if raw_time:
        own["time_created"] = raw_time
    return OpenAIRecord(
        index,
        chat,
        timestamp=normalise_timestamp(raw_time),
        metadata={"reme": own} if own else {},
    )


def load(source: Source) -> Transcript:
    warnings: list[str] = []
    records = [_record(i, m) for i, m in enumerate(source.value)]
    messages = convert_openai_records(records, fmt=FORMAT, path="messages", timeline=Timeline(source.mtime))
    meta: dict[str, Any] = {}
    return finish_transcript(FORMAT, messages, warnings, source, meta)
