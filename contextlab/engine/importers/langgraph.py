"""LangGraph thread state (``{"values": {"messages": [...]}, ...}``) of LangChain messages.

Messages are ``human`` / ``ai`` / ``tool`` (and ``system``) dicts. An ``ai``
message's ``tool_calls`` are ``{name, args, id}`` with ``args`` already parsed,
and DeepSeek-style reasoning sits in ``additional_kwargs.reasoning_content``
(sometimes it is the only text of the final answer, so it must not be lost).
A tool message's ``status`` of ``error`` marks a failed call. The state has no
per-message times: the checkpoint's ``created_at`` stamps them all.
"""

from __future__ import annotations

import json
from typing import Any

from contextlab.engine.convert.agentscope import normalise_timestamp
from contextlab.engine.convert.openai import parse_arguments
from contextlab.engine.core.errors import InvalidMessages
from contextlab.engine.core.messages import (
    Block,
    MediaBlock,
    Message,
    ResultPart,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextlab.engine.importers._common import Source, Timeline, Transcript, finish_transcript, make_message

FORMAT = "langgraph"
_ROLES: dict[str, Role] = {
    "human": "user",
    "ai": "assistant",
    "AIMessageChunk": "assistant",
    "tool": "tool",
    "system": "system",
}


def _state(source: Source) -> tuple[list[Any], dict[str, Any]] | None:
    value = source.value
    if source.kind != "json" or not isinstance(value, dict):
        return None
    values = value.get("values") if isinstance(value.get("values"), dict) else value
    messages = values.get("messages") if isinstance(values, dict) else None
    if not isinstance(messages, list) or not messages:
        return None
    # Recognised by shape; an unknown type further down is reported by load().
    if not all(isinstance(m, dict) and "type" in m for m in messages):
        return None
    if not any(isinstance(m["type"], str) and m["type"] in ("human", "ai", "AIMessageChunk") for m in messages):
        return None
    return messages, value


def matches(source: Source) -> bool:
    return _state(source) is not None


def _blocks(content: Any, where: str, warnings: list[str]) -> list[TextBlock | MediaBlock | ThinkingBlock]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [TextBlock(content)]
    if not isinstance(content, list):
        raise InvalidMessages("content must be a string or a list of blocks", field=where)
    out: list[TextBlock | MediaBlock | ThinkingBlock] = []
    for j, item in enumerate(content):
        if isinstance(item, str):
            out.append(TextBlock(item))
            continue
        if not isinstance(item, dict):
            raise InvalidMessages("a content block must be an object or a string", field=f"{where}[{j}]")
        kind = item.get("type")
        if kind == "text" and isinstance(item.get("text"), str):
            out.append(TextBlock(item["text"]))
        elif kind in ("thinking", "reasoning") and isinstance(item.get(kind), str):
            out.append(ThinkingBlock(item[kind]))
        elif kind == "image_url":
            inner = item.get("image_url")
            url = inner.get("url") if isinstance(inner, dict) else inner
            out.append(MediaBlock(kind="image", url=str(url)))
        elif kind in ("image", "audio", "video", "file") and (item.get("url") or item.get("data")):
            data = item.get("data")
            out.append(
                MediaBlock(
                    kind=kind,
                    url=item.get("url"),
                    data=data if isinstance(data, str) else None,
                    media_type=item.get("mime_type"),
                )
            )
        else:
            # Not something we model; keep it readable rather than drop it.
            warnings.append(f"{where}[{j}]: content block of type {kind!r} kept as JSON text")
            out.append(TextBlock(json.dumps(item, ensure_ascii=False)))
    return out


def load(source: Source) -> Transcript:
    found = _state(source)
    assert found is not None
    raw_messages, state = found
    warnings: list[str] = []
    timeline = Timeline(normalise_timestamp(state.get("created_at")) or source.mtime)
    call_names: dict[str, str] = {}
    messages: list[Message] = []
    for index, item in enumerate(raw_messages):
        where = f"values.messages[{index}]"
        if not isinstance(item, dict):
            raise InvalidMessages("a message must be an object", field=where)
        kind = item.get("type")
        if not isinstance(kind, str) or kind not in _ROLES:
            raise InvalidMessages(
                f"unknown message type {kind!r}; expected human, ai, tool or system", field=f"{where}.type"
            )
        role = _ROLES[str(kind)]
        msg_id = str(item.get("id") or f"{FORMAT}-{index}")
        content = _blocks(item.get("content"), f"{where}.content", warnings)
        meta: dict[str, Any] = {}
        response_meta = item.get("response_metadata")
        if isinstance(response_meta, dict):
            if response_meta.get("model_name"):
                meta["model"] = response_meta["model_name"]
            if response_meta.get("finish_reason"):
                meta["finish_reason"] = response_meta["finish_reason"]
        if item.get("usage_metadata"):
            meta["usage"] = item["usage_metadata"]
        name = item.get("name") if isinstance(item.get("name"), str) else None
        blocks: list[Block]
        if role == "tool":
            call_id = item.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidMessages("a tool message needs a tool_call_id", field=f"{where}.tool_call_id")
            output: str | tuple[ResultPart, ...]
            if isinstance(item.get("content"), str):
                output = item["content"]
            else:
                output = tuple(b if not isinstance(b, ThinkingBlock) else TextBlock(b.thinking) for b in content)
            blocks = [
                ToolResultBlock(
                    id=call_id,
                    name=name or call_names.get(call_id, ""),
                    output=output,
                    is_error=item.get("status") == "error",
                )
            ]
            if item.get("artifact") is not None:
                meta["artifact"] = item["artifact"]
            name = None  # the tool's name is on the result, not a participant name
        elif role == "assistant":
            blocks = []
            extra = item.get("additional_kwargs")
            reasoning = extra.get("reasoning_content") if isinstance(extra, dict) else None
            if isinstance(reasoning, str) and reasoning:
                blocks.append(ThinkingBlock(reasoning))
            blocks.extend(content)
            blocks.extend(_calls(item, msg_id, where, call_names, warnings, meta))
        else:
            blocks = list(content)
        messages.append(
            make_message(
                role, blocks, msg_id=msg_id, fmt=FORMAT, index=index, timestamp=timeline.stamp(None), name=name, **meta
            )
        )
    transcript_meta: dict[str, Any] = {}
    values = state.get("values")
    if isinstance(values, dict) and isinstance(values.get("title"), str):
        transcript_meta["title"] = values["title"]
    return finish_transcript(FORMAT, messages, warnings, source, transcript_meta)


def _calls(
    item: dict[str, Any],
    msg_id: str,
    where: str,
    call_names: dict[str, str],
    warnings: list[str],
    meta: dict[str, Any],
) -> list[ToolUseBlock]:
    out: list[ToolUseBlock] = []
    for key in ("tool_calls", "invalid_tool_calls"):
        if not isinstance(item.get(key) or [], list):
            raise InvalidMessages(f"{key} must be a list", field=f"{where}.{key}")
    for j, call in enumerate(item.get("tool_calls") or []):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise InvalidMessages("a tool call needs a name", field=f"{where}.tool_calls[{j}]")
        call_id = str(call.get("id") or f"{msg_id}-call-{j}")
        args = call.get("args")
        out.append(ToolUseBlock(id=call_id, name=call["name"], input=dict(args) if isinstance(args, dict) else {}))
        call_names[call_id] = call["name"]
    invalid_ids: list[str] = []
    for j, call in enumerate(item.get("invalid_tool_calls") or []):
        if not isinstance(call, dict):
            continue
        # The model did emit these (with arguments that did not parse); the
        # provider saw them as calls, so they stay calls, raw text kept.
        call_id = str(call.get("id") or f"{msg_id}-invalid-{j}")
        raw = call.get("args")
        raw_text = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)
        name = str(call.get("name") or "")
        out.append(ToolUseBlock(id=call_id, name=name, input=parse_arguments(raw_text), raw_input=raw_text))
        call_names[call_id] = name
        invalid_ids.append(call_id)
        warnings.append(f"{where}: invalid tool call {call_id!r} kept with its raw arguments")
    if invalid_ids:
        meta["invalid_tool_calls"] = invalid_ids
    return out
