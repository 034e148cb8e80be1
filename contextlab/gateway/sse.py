"""Server-sent events of a streamed chat completion: framing, and the reply they add up to.

Pure functions, no Django. Events are passed to the client as the provider
framed them; only the gateway's own addition (the usage chunk it asked for on
the client's behalf) is taken out again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from contextlab.engine.core.unicode import repaired


@dataclass
class Event:
    """One SSE event: its raw lines (without line endings) and its decoded ``data``."""

    lines: list[bytes]
    data: bytes | None

    def encode(self) -> bytes:
        return b"\n".join(self.lines) + b"\n\n"

    @property
    def done(self) -> bool:
        return self.data is not None and self.data.strip() == b"[DONE]"

    def json(self) -> Any:
        """The data as JSON, or None when it is not a JSON chunk."""
        if self.data is None or self.done:
            return None
        try:
            return repaired(json.loads(self.data))
        except (ValueError, RecursionError):
            return None


def events(lines: Iterable[bytes]) -> Iterator[Event]:
    """Group lines (line endings already stripped) into events at each blank line."""
    buffer: list[bytes] = []
    for raw in lines:
        line = raw.rstrip(b"\r")
        if line:
            buffer.append(line)
            continue
        if buffer:
            yield _event(buffer)
            buffer = []
    if buffer:
        yield _event(buffer)


def _event(lines: list[bytes]) -> Event:
    data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
    return Event(lines=lines, data=b"\n".join(data) if data else None)


def is_usage_only(chunk: Any) -> bool:
    """The extra chunk ``stream_options.include_usage`` adds: usage and no choices."""
    return isinstance(chunk, dict) and bool(chunk.get("usage")) and not chunk.get("choices")


def without_usage(event: Event, chunk: dict[str, Any]) -> Event:
    """The event with ``usage`` removed from its chunk (providers that put it beside choices)."""
    trimmed = {k: v for k, v in chunk.items() if k != "usage"}
    data = json.dumps(trimmed, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return Event(lines=[b"data: " + data], data=data)


def error_event(message: str, *, code: str) -> Event:
    """An event in the shape OpenAI streams an error in mid-stream (``data: {"error": {...}}``).

    The official SDKs (Python and JavaScript) raise an ``APIError`` when a data
    event carries ``error``, so a stream that breaks reaches the caller as an
    exception, never as a reply that just stops.
    """
    data = json.dumps({"error": {"message": message, "type": "server_error", "param": None, "code": code}},
                      ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return Event(lines=[b"data: " + data], data=data)


@dataclass
class _Call:
    id: str = ""
    type: str = "function"
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class ReplyBuilder:
    """Adds up the deltas of choice 0 into the assistant message they stream."""

    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    chunks: int = 0
    model: str = ""  # the model the provider says answered

    def add(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            return
        self.chunks += 1
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self.model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._add_delta(delta)

    def _add_delta(self, delta: dict[str, Any]) -> None:
        for key, sink in (("content", self.content), ("reasoning_content", self.reasoning),
                          ("refusal", self.refusal)):
            if isinstance(delta.get(key), str):
                sink.append(delta[key])
        for position, call in enumerate(delta.get("tool_calls") or []):
            if not isinstance(call, dict):
                continue
            index = call.get("index", position)
            entry = self.calls.setdefault(index if isinstance(index, int) else position, _Call())
            if isinstance(call.get("id"), str) and call["id"]:
                entry.id = call["id"]
            if isinstance(call.get("type"), str):
                entry.type = call["type"]
            function = call.get("function")
            if isinstance(function, dict):
                if isinstance(function.get("name"), str):
                    entry.name += function["name"]
                if isinstance(function.get("arguments"), str):
                    entry.arguments.append(function["arguments"])

    @property
    def complete(self) -> bool:
        return self.finish_reason is not None

    def message(self) -> dict[str, Any]:
        """The streamed reply as a non-streamed completion would have given it."""
        message: dict[str, Any] = {"role": "assistant",
                                   "content": "".join(self.content) if self.content else None}
        if self.calls:
            message["tool_calls"] = [
                {"id": c.id, "type": c.type, "function": {"name": c.name, "arguments": "".join(c.arguments)}}
                for _, c in sorted(self.calls.items())
            ]
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        return message
