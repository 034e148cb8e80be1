"""One recorded chat-completions request: the body an agent sent, or a capture around it.

The body is the OpenAI request itself (``{"model", "messages", "tools", ...}``);
a capture wraps it as ``{"body": {...}}`` next to what the server answered (the
request log of a CoPaw 1.0.2 run is one such file per call). The messages are
what the model got on that call, and ``tools`` the definitions sent with it,
carried in ``Transcript.tools`` so a replay budgets them like the provider did.
"""

from __future__ import annotations

from typing import Any

from contextlab.engine.importers._common import (
    Source,
    Timeline,
    Transcript,
    finish_transcript,
    recorded_tools,
)
from contextlab.engine.importers.message_list import OpenAIRecord, convert_openai_records

FORMAT = "openai_request"


def _body(source: Source) -> dict[str, Any] | None:
    value = source.value
    if source.kind != "json" or not isinstance(value, dict):
        return None
    body = value["body"] if isinstance(value.get("body"), dict) else value
    messages = body.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, dict) and "role" in m for m in messages):
        return body
    return None


def matches(source: Source) -> bool:
    return _body(source) is not None


def load(source: Source) -> Transcript:
    body = _body(source)
    assert body is not None
    warnings: list[str] = []
    messages = convert_openai_records(
        (OpenAIRecord(index, data) for index, data in enumerate(body["messages"])),
        fmt=FORMAT, path="body.messages", timeline=Timeline(source.mtime),
    )
    meta: dict[str, Any] = {k: body[k] for k in ("model",) if isinstance(body.get(k), str)}
    return finish_transcript(FORMAT, messages, warnings, source, meta,
                             tools=recorded_tools(body.get("tools"), "tools", warnings))
