"""ContextLab's own message form (``Message.to_dict()``), as a JSON array or
one message per line: what ``final_context.json``'s ``live_messages``, the
``dialog/*.jsonl`` archive of the ``contextlab`` policy and the web app's
exports hold. Importing it keeps ids, ``is_error`` flags and metadata exactly.

It looks like AgentScope's ``Msg`` dicts (same keys); what tells them apart is
our ``tool`` role or ISO 8601 timestamps (AgentScope writes
``YYYY-MM-DD HH:MM:SS.mmm``).
"""

from __future__ import annotations

from typing import Any

from contextlab.engine.core.errors import ContextLabError, InvalidMessages
from contextlab.engine.core.messages import ROLES, Message
from contextlab.engine.importers._common import Source, Transcript, finish_transcript

FORMAT = "contextlab_messages"
_KEYS = {"id", "role", "content", "timestamp", "metadata"}


def _records(source: Source) -> list[tuple[int, Any]] | None:
    if source.kind == "json" and isinstance(source.value, list):
        return list(enumerate(source.value))
    if source.kind == "jsonl":
        return source.records
    return None


def _ours(record: Any) -> bool:
    return (isinstance(record, dict) and record.keys() >= _KEYS and record["role"] in ROLES
            and isinstance(record["content"], list))


def matches(source: Source) -> str | None:
    records = _records(source)
    if not records or not all(_ours(r) for _, r in records):
        return None
    iso = all("T" in str(r.get("timestamp", "")) for _, r in records)
    has_tool_role = any(r["role"] == "tool" for _, r in records)
    return FORMAT if iso or has_tool_role else None


def load(source: Source) -> Transcript:
    records = _records(source) or []
    messages: list[Message] = []
    for index, record in records:
        try:
            msg = Message.from_dict(record)
        except ContextLabError as exc:
            raise InvalidMessages(exc.message, field=f"messages[{index}].{exc.field or 'content'}") from exc
        meta = {"source_index": index, "source_format": FORMAT, **msg.metadata}
        messages.append(msg.with_metadata(**meta))
    return finish_transcript(FORMAT, messages, [], source, {})
