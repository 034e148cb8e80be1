"""Claude Code session logs (``~/.claude/projects/*/<session>.jsonl``, subagents too).

Each line is an envelope around one Anthropic message. Claude Code writes one
API response over several ``assistant`` lines that share ``message.id`` (one
content block per line, tool results of parallel calls interleaved between
them), so lines are merged back into one assistant message per response.

Only what the model saw becomes a message. ``progress``,
``file-history-snapshot`` and ``queue-operation`` records and the UI-only system
records (hook summaries, turn durations) are counted in
``Transcript.metadata["skipped_records"]``. Compaction is kept: the
``compact_boundary`` record becomes a system note and the summary the model was
given stays a user message flagged ``compact_summary``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from contextlab.engine.convert.agentscope import normalise_timestamp
from contextlab.engine.convert.anthropic import HINTS_KEY, parse_anthropic_blocks
from contextlab.engine.core.errors import InvalidMessages
from contextlab.engine.core.messages import Block, Message, TextBlock, ToolResultBlock
from contextlab.engine.importers._common import (
    Source,
    Timeline,
    Transcript,
    make_message,
    numbered_ids,
    repaired_transcript,
)

FORMAT = "claude_code"
_ENVELOPE_TYPES = frozenset(
    {"user", "assistant", "system", "progress", "file-history-snapshot", "queue-operation", "summary"}
)
_SKIPPED = frozenset({"progress", "file-history-snapshot", "queue-operation", "summary"})


def _records(source: Source) -> list[tuple[int, Any]]:
    if source.kind == "jsonl":
        return source.records
    if source.kind == "json" and isinstance(source.value, dict):
        return [(0, source.value)]  # a session of a single line
    return []


def matches(source: Source) -> bool:
    first = [value for _, value in _records(source)[:5]]
    return bool(first) and all(
        isinstance(r, dict)
        and isinstance(r.get("type"), str)
        and r["type"] in _ENVELOPE_TYPES
        and ("sessionId" in r or "uuid" in r or "message" in r or "messageId" in r)
        for r in first
    )


class _Assistant:
    """One API response being put back together from its lines."""

    def __init__(self, index: int, record: dict[str, Any], message: dict[str, Any]) -> None:
        self.index = index
        self.record = record
        self.message = message
        self.blocks: list[Block] = []
        self.hints: list[dict[str, Any]] = []
        self.indices: list[int] = []
        self.last_message = message

    def build(self, msg_id: str, timeline: Timeline) -> Message:
        meta: dict[str, Any] = {}
        if any(set(h) != {"type"} for h in self.hints):
            meta[HINTS_KEY] = {"blocks": self.hints}
        return make_message(
            "assistant",
            self.blocks,
            msg_id=msg_id,
            fmt=FORMAT,
            index=self.index,
            timestamp=timeline.stamp(normalise_timestamp(self.record.get("timestamp"))),
            source_indices=self.indices,
            model=self.message.get("model"),
            stop_reason=self.last_message.get("stop_reason"),
            usage=self.last_message.get("usage"),
            claude_code=_envelope(self.record),
            **meta,
        )


def _envelope(record: dict[str, Any]) -> dict[str, Any]:
    keep = ("uuid", "parentUuid", "sessionId", "isSidechain", "requestId", "isMeta", "agentId")
    return {k: record[k] for k in keep if k in record}


def load(source: Source) -> Transcript:
    warnings: list[str] = []
    skipped: Counter[str] = Counter()
    timeline = Timeline(source.mtime)
    call_names: dict[str, str] = {}
    # Items in file order: a finished Message, or an _Assistant still collecting lines.
    items: list[Message | _Assistant] = []
    open_responses: dict[str, _Assistant] = {}

    for line, record in _records(source):
        if not isinstance(record, dict):
            warnings.append(f"line {line + 1} is not a JSON object; skipped")
            continue
        kind = record.get("type")
        if not isinstance(kind, str):
            warnings.append(f"line {line + 1}: record without a type; skipped")
            continue
        if kind in _SKIPPED:
            skipped[str(kind)] += 1
            continue
        if kind == "system":
            if record.get("subtype") == "compact_boundary":
                items.append(_boundary(line, record, timeline))
            else:
                skipped[f"system:{record.get('subtype')}"] += 1
            continue
        if kind not in ("user", "assistant"):
            skipped[str(kind)] += 1
            warnings.append(f"line {line + 1}: unknown record type {kind!r}; skipped")
            continue
        message = record.get("message")
        if not isinstance(message, dict):
            warnings.append(f"line {line + 1}: {kind} record without a message object; skipped")
            continue
        content = message.get("content")
        if kind == "assistant":
            response_id = str(message.get("id") or record.get("uuid") or f"{FORMAT}-{line}")
            builder = open_responses.get(response_id)
            if builder is None:
                builder = _Assistant(line, record, message)
                open_responses[response_id] = builder
                items.append(builder)
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
            parsed = parse_anthropic_blocks(blocks, f"line {line + 1}: message.content", "assistant", call_names)
            builder.blocks.extend(b for b, _ in parsed)
            builder.hints.extend(h for _, h in parsed)
            builder.indices.append(line)
            builder.last_message = message
            continue
        items.extend(_user(line, record, content, call_names, timeline))

    messages: list[Message] = []
    for item in items:
        if isinstance(item, _Assistant):
            response_id = str(item.message.get("id") or item.record.get("uuid") or f"{FORMAT}-{item.index}")
            messages.append(item.build(response_id, timeline))
        else:
            messages.append(item)
    # Claude Code does not log its system prompt.
    return repaired_transcript(
        FORMAT, messages, warnings, source, {"skipped_records": dict(skipped)}, system_prompt=None
    )


def _boundary(line: int, record: dict[str, Any], timeline: Timeline) -> Message:
    raw = record.get("compactMetadata")
    compact: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return make_message(
        "system",
        [TextBlock(str(record.get("content") or "Conversation compacted"))],
        msg_id=str(record.get("uuid") or f"{FORMAT}-{line}"),
        fmt=FORMAT,
        index=line,
        timestamp=timeline.stamp(normalise_timestamp(record.get("timestamp"))),
        compact_boundary=True,
        compact_trigger=compact.get("trigger"),
        compact_pre_tokens=compact.get("preTokens"),
        claude_code=_envelope(record),
    )


def _user(
    line: int, record: dict[str, Any], content: Any, call_names: dict[str, str], timeline: Timeline
) -> list[Message]:
    stamp = timeline.stamp(normalise_timestamp(record.get("timestamp")))
    flags: dict[str, Any] = {"claude_code": _envelope(record)}
    if record.get("isCompactSummary"):
        flags["compact_summary"] = True
    if record.get("isMeta"):
        flags["is_meta"] = True
    base_id = str(record.get("uuid") or f"{FORMAT}-{line}")
    if isinstance(content, str) or content is None:
        return [make_message("user", [TextBlock(content or "")], msg_id=base_id, fmt=FORMAT, index=line,
                             timestamp=stamp, **flags)]
    if not isinstance(content, list):
        raise InvalidMessages("message.content must be a string or a list", field=f"line {line + 1}: message.content")
    parsed = parse_anthropic_blocks(content, f"line {line + 1}: message.content", "user", call_names)
    results = [(b, h) for b, h in parsed if isinstance(b, ToolResultBlock)]
    rest = [(b, h) for b, h in parsed if not isinstance(b, ToolResultBlock)]
    pieces: list[tuple[str, list[Block], list[dict[str, Any]]]] = [("tool", [b], [h]) for b, h in results]
    if rest or not results:
        pieces.append(("user", [b for b, _ in rest], [h for _, h in rest]))
    ids = numbered_ids(base_id, len(pieces))
    out: list[Message] = []
    for role, blocks, hints in pieces:
        extra: dict[str, Any] = dict(flags)
        if any(set(h) != {"type"} for h in hints):
            extra[HINTS_KEY] = {"blocks": hints}
        out.append(
            make_message(
                "tool" if role == "tool" else "user",
                blocks,
                msg_id=next(ids),
                fmt=FORMAT,
                index=line,
                timestamp=stamp,
                **extra,
            )
        )
    return out
