"""DeerFlow 1 replay streams: server-sent events, streamed token by token.

``message_chunk`` events carry text fragments, concatenated per message ``id``;
``tool_calls`` / ``tool_call_chunks`` events carry call fragments (``id`` and
``name`` on the first chunk of an ``index``, then ``args`` pieces);
``tool_call_result`` is one whole result. ``interrupt`` (the planner asking a
person to review its plan) and any other event with text in ``content`` become
a message of their own, so no text of the stream is lost. ``agent`` names the sub-agent
(coordinator, planner, researcher, reporter) and is kept as the message name
and in metadata. Each sub-agent had its own context in reality, so the stream
is a merged view of them; a message's ``source_index`` is its first event.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from contextlab.engine.convert.openai import parse_arguments
from contextlab.engine.core.messages import (
    Block,
    Message,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextlab.engine.importers._common import (
    Source,
    SseEvent,
    Timeline,
    Transcript,
    make_message,
    repaired_transcript,
)

FORMAT = "deerflow_sse"
_MESSAGE_EVENTS = frozenset({"message_chunk", "tool_calls", "tool_call_chunks"})
_KNOWN_EVENTS = _MESSAGE_EVENTS | {"tool_call_result", "interrupt"}


def matches(source: Source) -> bool:
    return source.kind == "sse" and any(e.event in _KNOWN_EVENTS for e in source.events[:20])


@dataclass
class _Call:
    id: str
    name: str = ""
    args: list[str] = field(default_factory=list)


@dataclass
class _Streamed:
    id: str
    index: int
    role: str
    agent: str | None
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)
    by_index: dict[int, _Call] = field(default_factory=dict)
    finish_reason: str | None = None
    events: int = 0

    def add_chunk(self, chunk: dict[str, Any]) -> None:
        position = chunk.get("index")
        slot = position if isinstance(position, int) else len(self.calls)
        chunk_id = chunk.get("id") or ""
        current = self.by_index.get(slot)
        if current is None or (chunk_id and chunk_id != current.id):
            current = _Call(id=str(chunk_id) or f"{self.id}-call-{len(self.calls)}")
            self.by_index[slot] = current
            self.calls.append(current)
        if chunk.get("name"):
            current.name = str(chunk["name"])
        args = chunk.get("args")
        if isinstance(args, str):
            current.args.append(args)


def load(source: Source) -> Transcript:
    warnings: list[str] = []
    skipped: Counter[str] = Counter()
    items: list[_Streamed | SseEvent] = []
    streams: dict[str, _Streamed] = {}
    for event in source.events:
        data = event.data
        if not isinstance(data, dict):
            warnings.append(f"event {event.index} (line {event.line}) has no JSON object; skipped")
            continue
        if event.event == "tool_call_result":
            items.append(event)
            continue
        if event.event not in _MESSAGE_EVENTS and _event_text(data):
            items.append(event)
            if event.event not in _KNOWN_EVENTS:
                warnings.append(f"event {event.index}: unknown event type {event.event!r}; kept its text "
                                "as a message")
            continue
        if event.event not in _MESSAGE_EVENTS:
            skipped[event.event] += 1
            if event.event not in _KNOWN_EVENTS:
                warnings.append(f"event {event.index}: unknown event type {event.event!r}; skipped")
            continue
        stream_id = str(data.get("id") or f"{FORMAT}-{event.index}")
        stream = streams.get(stream_id)
        if stream is None:
            agent = data.get("agent")
            stream = _Streamed(
                id=stream_id,
                index=event.index,
                role=str(data.get("role") or "assistant"),
                agent=agent if isinstance(agent, str) else None,
            )
            streams[stream_id] = stream
            items.append(stream)
        stream.events += 1
        if isinstance(data.get("content"), str):
            stream.text.append(data["content"])
        if isinstance(data.get("reasoning_content"), str):
            stream.reasoning.append(data["reasoning_content"])
        if isinstance(data.get("finish_reason"), str):
            stream.finish_reason = data["finish_reason"]
        chunks = data.get("tool_call_chunks")
        if isinstance(chunks, list) and chunks:
            for chunk in chunks:
                if isinstance(chunk, dict):
                    stream.add_chunk(chunk)
        elif isinstance(data.get("tool_calls"), list):
            # A whole call without chunks: take its already-parsed arguments.
            for call in data["tool_calls"]:
                if isinstance(call, dict) and call.get("id"):
                    stream.add_chunk(
                        {"id": call["id"], "name": call.get("name"), "args": json.dumps(call.get("args") or {})}
                    )

    timeline = Timeline(source.mtime)
    call_names: dict[str, str] = {}
    messages: list[Message] = []
    for item in items:
        if isinstance(item, _Streamed):
            messages.append(_message(item, timeline, call_names))
        elif item.event != "tool_call_result":
            messages.append(_event_message(item, timeline))
        else:
            messages.append(_result(item, timeline, call_names))
    metadata: dict[str, Any] = {"skipped_records": dict(skipped)} if skipped else {}
    # The stream does not carry the agents' prompts.
    return repaired_transcript(FORMAT, messages, warnings, source, metadata, system_prompt=None)


def _message(stream: _Streamed, timeline: Timeline, call_names: dict[str, str]) -> Message:
    blocks: list[Block] = []
    reasoning = "".join(stream.reasoning)
    if reasoning:
        blocks.append(ThinkingBlock(reasoning))
    text = "".join(stream.text)
    if text:
        blocks.append(TextBlock(text))
    for call in stream.calls:
        raw = "".join(call.args)
        blocks.append(ToolUseBlock(id=call.id, name=call.name, input=parse_arguments(raw), raw_input=raw))
        call_names[call.id] = call.name
    role: Role = "user" if stream.role == "user" else "assistant"
    return make_message(
        role,
        blocks,
        msg_id=stream.id,
        fmt=FORMAT,
        index=stream.index,
        timestamp=timeline.stamp(None),
        name=stream.agent,
        agent=stream.agent,
        finish_reason=stream.finish_reason,
        event_count=stream.events,
    )


def _event_text(data: dict[str, Any]) -> str:
    content = data.get("content")
    return content if isinstance(content, str) and content.strip() else ""


def _event_message(event: SseEvent, timeline: Timeline) -> Message:
    """A whole message carried by one event (``interrupt``: the plan review prompt)."""
    data: dict[str, Any] = event.data
    agent = data.get("agent") if isinstance(data.get("agent"), str) else None
    role: Role = "user" if data.get("role") == "user" else "assistant"
    options = data.get("options")
    return make_message(
        role,
        [TextBlock(_event_text(data))],
        msg_id=str(data.get("id") or f"{FORMAT}-{event.index}"),
        fmt=FORMAT,
        index=event.index,
        timestamp=timeline.stamp(None),
        name=agent,
        agent=agent,
        sse_event=event.event,
        finish_reason=data.get("finish_reason") if isinstance(data.get("finish_reason"), str) else None,
        options=options if isinstance(options, list) else None,
    )


def _result(event: SseEvent, timeline: Timeline, call_names: dict[str, str]) -> Message:
    data: dict[str, Any] = event.data
    call_id = str(data.get("tool_call_id") or "")
    content = data.get("content")
    output = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    agent = data.get("agent") if isinstance(data.get("agent"), str) else None
    return make_message(
        "tool",
        [ToolResultBlock(id=call_id, name=call_names.get(call_id, ""), output=output)],
        msg_id=str(data.get("id") or f"{FORMAT}-{event.index}"),
        fmt=FORMAT,
        index=event.index,
        timestamp=timeline.stamp(None),
        agent=agent,
    )
