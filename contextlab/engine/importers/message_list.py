"""Plain message lists: OpenAI, Anthropic or AgentScope messages saved as a JSON
array or one per line (CoPaw's ``dialog/YYYY-MM-DD.jsonl`` is the latter).

Also home of ``convert_openai_records``, which the OpenAI-shaped agent formats
(tau-bench, SWE-agent, ReMe) share.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from contextlab.engine.convert import detect_message_format
from contextlab.engine.convert.agentscope import parse_agentscope_msg
from contextlab.engine.convert.anthropic import parse_anthropic_message
from contextlab.engine.convert.openai import parse_openai_message
from contextlab.engine.core.errors import InvalidMessages
from contextlab.engine.core.messages import Message
from contextlab.engine.importers._common import (
    Source,
    Timeline,
    Transcript,
    finish_transcript,
    make_message,
    numbered_ids,
)


def _records(source: Source) -> list[tuple[int, Any]] | None:
    if source.kind == "json" and isinstance(source.value, list):
        return list(enumerate(source.value))
    if source.kind == "jsonl":
        return source.records
    return None


def matches(source: Source) -> str | None:
    records = _records(source)
    if not records or not all(isinstance(v, dict) and "role" in v for _, v in records):
        return None
    try:
        return f"{detect_message_format([v for _, v in records])}_messages"
    except InvalidMessages:
        return None


@dataclass
class OpenAIRecord:
    """One OpenAI-shaped message from a source, with what the source says about it."""

    index: int
    data: Any
    msg_id: str | None = None
    timestamp: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def convert_openai_records(
    records: Iterable[OpenAIRecord], *, fmt: str, path: str, timeline: Timeline
) -> list[Message]:
    """OpenAI-shaped records (already cleaned of format-specific keys) as messages."""
    call_names: dict[str, str] = {}
    out: list[Message] = []
    for record in records:
        msg = parse_openai_message(record.data, record.index, call_names, path=path)
        out.append(
            make_message(
                msg.role,
                msg.content,
                msg_id=record.msg_id or f"{fmt}-{record.index}",
                fmt=fmt,
                index=record.index,
                timestamp=timeline.stamp(record.timestamp),
                name=msg.name,
                **msg.metadata,
                **record.metadata,
            )
        )
    return out


def load(source: Source, fmt: str) -> Transcript:
    records = _records(source) or []
    warnings: list[str] = []
    timeline = Timeline(source.mtime)
    meta: dict[str, Any] = {}
    path = "messages"
    if fmt == "openai_messages":
        messages = convert_openai_records(
            (OpenAIRecord(index, data) for index, data in records), fmt=fmt, path=path, timeline=timeline
        )
    else:
        messages = []
        call_names: dict[str, str] = {}
        for index, record in records:
            if fmt == "anthropic_messages":
                converted = parse_anthropic_message(record, index, call_names, path=path)
                base = f"{fmt}-{index}"
            else:
                converted = parse_agentscope_msg(record, index, call_names, path=path)
                base = converted[0].id if converted and "id" in record else f"{fmt}-{index}"
            for msg, msg_id in zip(converted, numbered_ids(base, len(converted)), strict=True):
                own_time = msg.timestamp if fmt == "agentscope_messages" and record.get("timestamp") else None
                messages.append(
                    make_message(
                        msg.role,
                        msg.content,
                        msg_id=msg_id,
                        fmt=fmt,
                        index=index,
                        timestamp=timeline.stamp(own_time),
                        name=msg.name,
                        **msg.metadata,
                    )
                )
    return finish_transcript(fmt, messages, warnings, source, meta)
