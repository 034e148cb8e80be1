"""AgentScope ``Msg`` dicts (CoPaw, ReMe) to and from the engine's message model.

An AgentScope record is ``{"id", "name", "role", "content", "metadata",
"timestamp"}`` with role user, assistant or system. Tool results travel in a
``system`` message (CoPaw's ReAct agent) or a ``user`` one; the engine makes
each result a role-``tool`` message and remembers the original role, record id
and timestamp string in ``metadata["agentscope"]`` so ``to_agentscope`` can
rebuild the record.

AgentScope stamps messages with the process's local time and no zone
("2026-03-19 23:59:59.900"). The engine's timestamps are UTC; a naive time is
taken as UTC (there is no way to know the zone it was written in) and the
original string is kept so that it comes back unchanged.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from contextlab.engine.convert._blocks import block_type, parse_result_output, parse_tool_use, str_field
from contextlab.engine.core.errors import InvalidMessages
from contextlab.engine.core.messages import (
    Block,
    MediaBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    block_to_dict,
    utc_now_iso,
)

HINTS_KEY = "agentscope"
_ROLES = ("user", "assistant", "system")
_MEDIA = ("image", "audio", "video", "file")


def normalise_timestamp(value: Any) -> str | None:
    """A UTC ISO 8601 string ("...Z") for a source timestamp, or None if unreadable.

    Accepts ISO 8601 (with or without zone, "T" or space), AgentScope's
    "YYYY-MM-DD HH:MM:SS.mmm", and Unix seconds. Naive times are taken as UTC.
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        try:
            moment = dt.datetime.fromtimestamp(float(value), tz=dt.UTC)
        except (OverflowError, OSError, ValueError):
            return None
    elif isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            moment = dt.datetime.fromisoformat(text)
        except ValueError:
            return None
    else:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def agentscope_timestamp(iso: str) -> str:
    """AgentScope's "YYYY-MM-DD HH:MM:SS.mmm" for one of our UTC timestamps."""
    normal = normalise_timestamp(iso)
    if normal is None:
        return iso
    moment = dt.datetime.fromisoformat(normal.replace("Z", "+00:00"))
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


# -- reading --------------------------------------------------------------------------


def _media(item: Mapping[str, Any], where: str) -> MediaBlock:
    kind = item["type"]
    source = item.get("source")
    if isinstance(source, str):
        return MediaBlock(kind=kind, url=source)
    if not isinstance(source, dict):
        raise InvalidMessages(f"a {kind} block needs a source", field=f"{where}.source")
    if source.get("type") == "base64":
        data = source.get("data")
        if not isinstance(data, str):
            raise InvalidMessages("source.data must be a string", field=f"{where}.source.data")
        media_type = source.get("media_type")
        return MediaBlock(kind=kind, data=data, media_type=media_type if isinstance(media_type, str) else None)
    url = source.get("url")
    if not isinstance(url, str):
        raise InvalidMessages("source.url must be a string", field=f"{where}.source.url")
    return MediaBlock(kind=kind, url=url)


def _block(item: Any, where: str, call_names: dict[str, str]) -> Block:
    kind = block_type(item, where)
    if kind == "text":
        return TextBlock(str_field(item, "text", where))
    if kind == "thinking":
        return ThinkingBlock(str_field(item, "thinking", where))
    if kind == "tool_use":
        use = parse_tool_use(item, where, tool_input=item.get("input") or {}, raw_input=item.get("raw_input"))
        call_names[use.id] = use.name
        return use
    if kind == "tool_result":
        call_id = item.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidMessages("a tool_result block needs a non-empty string id", field=f"{where}.id")
        name = item.get("name")
        return ToolResultBlock(
            id=call_id,
            name=name if isinstance(name, str) else call_names.get(call_id, ""),
            output=parse_result_output(
                item.get("output"),
                f"{where}.output",
                key="output",
                media_kinds=_MEDIA,
                parse_media=_media,
                accepted="text and media blocks",
            ),
        )
    if kind in _MEDIA:
        return _media(item, where)
    raise InvalidMessages(
        f"unknown content block type {kind!r}; expected text, thinking, tool_use, tool_result, "
        "image, audio, video or file",
        field=f"{where}.type",
    )


def parse_agentscope_msg(
    data: Any, index: int, call_names: dict[str, str], *, path: str = "messages"
) -> list[Message]:
    """One AgentScope record as internal messages (several when it holds tool results)."""
    where = f"{path}[{index}]"
    if not isinstance(data, dict):
        raise InvalidMessages("a message must be an object", field=where)
    role = data.get("role")
    if role not in _ROLES:
        raise InvalidMessages(
            f"unknown role {role!r}; AgentScope roles are user, assistant and system", field=f"{where}.role"
        )
    name = data.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidMessages("name must be a string", field=f"{where}.name")
    content = data.get("content")
    form = "string"
    if content is None or isinstance(content, str):
        blocks: list[Block] = [TextBlock(content)] if content else []
        form = "string" if content is not None else "null"
    elif isinstance(content, list):
        blocks = [_block(item, f"{where}.content[{j}]", call_names) for j, item in enumerate(content)]
        form = "list"
    else:
        raise InvalidMessages("content must be a string or a list of blocks", field=f"{where}.content")

    raw_meta = data.get("metadata")
    if raw_meta is not None and not isinstance(raw_meta, dict):
        raise InvalidMessages("metadata must be an object", field=f"{where}.metadata")
    source_id = data.get("id")
    msg_id = str(source_id) if isinstance(source_id, str | int) and source_id != "" else None
    raw_ts = data.get("timestamp")
    timestamp = normalise_timestamp(raw_ts) or utc_now_iso()
    hints: dict[str, Any] = {"role": role, "form": form}
    if msg_id is not None:
        hints["id"] = msg_id
    if raw_ts is not None:
        hints["timestamp"] = raw_ts
    if "metadata" in data:
        hints["metadata"] = dict(raw_meta) if raw_meta is not None else None
    extra = {k: v for k, v in data.items() if k not in ("id", "name", "role", "content", "metadata", "timestamp")}
    if extra:
        hints["extra"] = extra

    results = [b for b in blocks if isinstance(b, ToolResultBlock)]
    rest: list[Block] = [b for b in blocks if not isinstance(b, ToolResultBlock)]
    pieces: list[tuple[str, list[Block]]] = []
    if not results:
        pieces.append((role, rest))
    elif any(isinstance(b, ToolUseBlock) for b in rest):
        # Calls and their results in one record: the calls have to come first.
        pieces.append((role, rest))
        pieces.extend(("tool", [r]) for r in results)
    else:
        pieces.extend(("tool", [r]) for r in results)
        if rest:
            pieces.append((role, rest))
    out: list[Message] = []
    for n, (piece_role, piece_blocks) in enumerate(pieces):
        piece_hints = dict(hints, part=n, parts=len(pieces)) if len(pieces) > 1 else hints
        base_id = msg_id if msg_id is not None else None
        kwargs: dict[str, Any] = {}
        if base_id is not None:
            kwargs["id"] = base_id if n == 0 else f"{base_id}#{n}"
        out.append(
            Message(
                role=piece_role,  # type: ignore[arg-type]
                content=tuple(piece_blocks),
                name=name,
                timestamp=timestamp,
                metadata={HINTS_KEY: piece_hints},
                **kwargs,
            )
        )
    return out


def from_agentscope(
    msgs: list[dict[str, Any]], *, known_calls: Mapping[str, str] | None = None
) -> list[Message]:
    """Convert AgentScope ``Msg.to_dict()`` records; a result must answer an earlier call."""
    if not isinstance(msgs, list):
        raise InvalidMessages("messages must be a list of message objects", field="messages")
    call_names: dict[str, str] = dict(known_calls or {})
    out: list[Message] = []
    for index, data in enumerate(msgs):
        converted = parse_agentscope_msg(data, index, call_names)
        for msg in converted:
            for result in msg.tool_results:
                if result.id not in call_names:
                    position = next(
                        j
                        for j, item in enumerate(data["content"])
                        if isinstance(item, dict) and item.get("type") == "tool_result" and item.get("id") == result.id
                    )
                    raise InvalidMessages(
                        f"orphan tool result: no earlier tool_use has id {result.id!r}",
                        field=f"messages[{index}].content[{position}].id",
                    )
        out.extend(converted)
    return out


# -- writing --------------------------------------------------------------------------


def _render_media(block: MediaBlock) -> dict[str, Any]:
    if block.data is not None:
        source: dict[str, Any] = {"type": "base64", "media_type": block.media_type or "", "data": block.data}
    else:
        source = {"type": "url", "url": block.url or ""}
    return {"type": block.kind, "source": source}


def _render_block(block: Block) -> dict[str, Any]:
    if isinstance(block, ToolResultBlock):
        output: Any = block.output if isinstance(block.output, str) else [_render_block(p) for p in block.output]
        return {"type": "tool_result", "id": block.id, "name": block.name, "output": output}
    if isinstance(block, MediaBlock):
        return _render_media(block)
    # Text, thinking and tool_use blocks are written in AgentScope exactly as in
    # the engine's own JSON form.
    return block_to_dict(block)


def _hints(msg: Message) -> Mapping[str, Any]:
    raw = msg.metadata.get(HINTS_KEY)
    return raw if isinstance(raw, dict) else {}


def to_agentscope(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Internal messages as AgentScope ``Msg`` dicts.

    Pieces split from one record are put back into it; a tool message that did
    not come from AgentScope goes back as role ``system``, as CoPaw writes it.
    ``is_error`` has no AgentScope field and is not sent.
    """
    out: list[dict[str, Any]] = []
    group_key: tuple[str, int] | None = None
    for msg in messages:
        hints = _hints(msg)
        blocks = [_render_block(b) for b in msg.content]
        parts = hints.get("parts")
        source_id = hints.get("id")
        key = (str(source_id), int(parts)) if isinstance(parts, int) and source_id is not None else None
        if key is not None and key == group_key and out:
            # Another piece of the record just written: put it back in.
            content = out[-1]["content"]
            out[-1]["content"] = (content if isinstance(content, list) else []) + blocks
            continue
        group_key = key
        if msg.role == "tool":
            role = str(hints.get("role", "system"))
        else:
            role = str(hints.get("role", msg.role)) if key is not None else msg.role
        content_value: Any = blocks
        form = hints.get("form")
        text_only = all(isinstance(b, TextBlock) for b in msg.content)
        if form in ("string", "null") and text_only and len(msg.content) <= 1 and key is None:
            if msg.content:
                content_value = msg.content[0].text if isinstance(msg.content[0], TextBlock) else ""
            else:
                content_value = None if form == "null" else ""
        elif form is None and text_only and len(msg.content) == 1:
            # AgentScope's own constructor keeps plain text as a string.
            first = msg.content[0]
            content_value = first.text if isinstance(first, TextBlock) else blocks
        record: dict[str, Any] = {
            "id": str(source_id) if source_id is not None else msg.id,
            "name": msg.name if msg.name is not None else role,
            "role": role,
            "content": content_value,
            "metadata": hints.get("metadata", {}) if "metadata" in hints else {},
            "timestamp": hints["timestamp"] if "timestamp" in hints else agentscope_timestamp(msg.timestamp),
        }
        for extra_key, value in hints.get("extra", {}).items():
            record.setdefault(extra_key, value)
        out.append(record)
    return out
