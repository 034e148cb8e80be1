"""Anthropic Messages API payloads to and from the engine's message model.

Anthropic carries tool results inside *user* messages; the engine keeps one
role-``tool`` message per result so that every part of the engine pairs a call
with its result the same way whatever the provider. ``from_anthropic`` splits a
user message into its results (in order) followed by a user message for the
rest; ``to_anthropic`` puts them back together and merges consecutive
same-role messages, since the API wants strictly alternating turns.

Per-block details the model has no slot for (thinking signatures, which the API
needs to accept thinking back, ``cache_control``, citations) are kept in
``metadata["anthropic"]["blocks"]`` and given back while they still fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

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
)

HINTS_KEY = "anthropic"

_BLOCK_KEYS: dict[str, frozenset[str]] = {
    "text": frozenset({"type", "text"}),
    "thinking": frozenset({"type", "thinking"}),
    "redacted_thinking": frozenset({"type"}),
    "tool_use": frozenset({"type", "id", "name", "input"}),
    "tool_result": frozenset({"type", "tool_use_id", "content", "is_error"}),
    "image": frozenset({"type", "source"}),
    "document": frozenset({"type", "source"}),
}


# -- reading --------------------------------------------------------------------------


def _media_from_source(kind: str, source: Any, where: str) -> tuple[MediaBlock, dict[str, Any]]:
    if not isinstance(source, dict):
        raise InvalidMessages(f"an {kind} block needs a source object", field=f"{where}.source")
    media_kind: Literal["image", "file"] = "image" if kind == "image" else "file"
    source_type = source.get("type")
    hint: dict[str, Any] = {}
    if source_type in ("base64", "text"):
        data = source.get("data")
        if not isinstance(data, str):
            raise InvalidMessages("source.data must be a string", field=f"{where}.source.data")
        media_type = source.get("media_type")
        block = MediaBlock(
            kind=media_kind, data=data, media_type=media_type if isinstance(media_type, str) else None
        )
        if source_type == "text":
            hint["source"] = "text"
    elif source_type == "url":
        url = source.get("url")
        if not isinstance(url, str):
            raise InvalidMessages("source.url must be a string", field=f"{where}.source.url")
        block = MediaBlock(kind=media_kind, url=url)
    elif source_type == "file":
        file_id = source.get("file_id")
        if not isinstance(file_id, str):
            raise InvalidMessages("source.file_id must be a string", field=f"{where}.source.file_id")
        block = MediaBlock(kind=media_kind, url=file_id)
        hint["source"] = "file"
    else:
        raise InvalidMessages(
            f"unknown {kind} source type {source_type!r}; expected base64, url or file",
            field=f"{where}.source.type",
        )
    return block, hint


def _result_media(item: Mapping[str, Any], where: str) -> MediaBlock:
    # A result part has no hint of its own, so how the source was given is not kept.
    return _media_from_source(str(item["type"]), item.get("source"), where)[0]


def _parse_block(
    item: Any, where: str, role: str, call_names: dict[str, str]
) -> tuple[Block, dict[str, Any]]:
    kind = block_type(item, where)
    hint: dict[str, Any] = {"type": kind}
    block: Block
    if kind == "text":
        block = TextBlock(str_field(item, "text", where))
    elif kind == "thinking":
        block = ThinkingBlock(str_field(item, "thinking", where))
    elif kind == "redacted_thinking":
        # Encrypted reasoning: nothing readable, but the API wants it back verbatim.
        block = ThinkingBlock("")
    elif kind == "tool_use":
        if role != "assistant":
            raise InvalidMessages("tool_use blocks belong in assistant messages", field=f"{where}.type")
        block = parse_tool_use(item, where, tool_input=item.get("input", {}))
        call_names[block.id] = block.name
    elif kind == "tool_result":
        if role != "user":
            raise InvalidMessages("tool_result blocks belong in user messages", field=f"{where}.type")
        call_id = item.get("tool_use_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidMessages("a tool_result block needs a tool_use_id", field=f"{where}.tool_use_id")
        is_error = item.get("is_error", False)
        if not isinstance(is_error, bool):
            raise InvalidMessages("is_error must be true or false", field=f"{where}.is_error")
        block = ToolResultBlock(
            id=call_id,
            name=call_names.get(call_id, ""),
            output=parse_result_output(
                item.get("content"),
                f"{where}.content",
                key="content",
                media_kinds=("image", "document"),
                parse_media=_result_media,
                accepted="text, image and document blocks",
            ),
            is_error=is_error,
        )
        if "is_error" in item and not is_error:
            hint["explicit_is_error"] = True
        if "content" not in item:
            hint["no_content"] = True
    elif kind in ("image", "document"):
        block, source_hint = _media_from_source(str(kind), item.get("source"), where)
        hint.update(source_hint)
    else:
        raise InvalidMessages(
            f"unknown content block type {kind!r}; expected text, thinking, redacted_thinking, "
            "tool_use, tool_result, image or document",
            field=f"{where}.type",
        )
    extra = {k: v for k, v in item.items() if k not in _BLOCK_KEYS[str(kind)]}
    if extra:
        hint["extra"] = extra
    return block, hint


def parse_anthropic_blocks(
    content: list[Any], where: str, role: str, call_names: dict[str, str]
) -> list[tuple[Block, dict[str, Any]]]:
    """Each block of a content list with its hint (the block type plus unmodelled keys)."""
    return [_parse_block(item, f"{where}[{j}]", role, call_names) for j, item in enumerate(content)]


def block_hints_metadata(hints: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``metadata`` entry for blocks parsed together, empty when nothing needs keeping."""
    if any(set(h) != {"type"} for h in hints):
        return {HINTS_KEY: {"blocks": hints}}
    return {}


def _with_hints(role: Any, blocks: list[Block], hints: list[dict[str, Any]], form: str | None) -> Message:
    meta: dict[str, Any] = {}
    if any(set(h) != {"type"} for h in hints):
        meta["blocks"] = hints
    if form:
        meta["content"] = form
    return Message(role=role, content=tuple(blocks), metadata={HINTS_KEY: meta} if meta else {})


def parse_anthropic_message(
    data: Any, index: int, call_names: dict[str, str], *, path: str = "messages"
) -> list[Message]:
    """One API message as internal messages; orphan results are not checked here."""
    where = f"{path}[{index}]"
    if not isinstance(data, dict):
        raise InvalidMessages("a message must be an object", field=where)
    role = data.get("role")
    if role not in ("user", "assistant"):
        raise InvalidMessages(
            f"unknown role {role!r}; Anthropic messages are user or assistant "
            "(the system prompt is passed separately)",
            field=f"{where}.role",
        )
    content = data.get("content")
    if isinstance(content, str):
        return [_with_hints(role, [TextBlock(content)] if content else [], [], "string")]
    if not isinstance(content, list):
        raise InvalidMessages("content must be a string or a list of blocks", field=f"{where}.content")
    parsed = parse_anthropic_blocks(content, f"{where}.content", role, call_names)
    results = [(b, h) for b, h in parsed if isinstance(b, ToolResultBlock)]
    rest = [(b, h) for b, h in parsed if not isinstance(b, ToolResultBlock)]
    out = [_with_hints("tool", [b], [h], None) for b, h in results]
    if rest or not results:
        out.append(_with_hints(role, [b for b, _ in rest], [h for _, h in rest], None))
    return out


def _system_message(system: Any) -> Message | None:
    if system is None or system == "":
        return None
    if isinstance(system, str):
        return _with_hints("system", [TextBlock(system)], [], "string")
    if not isinstance(system, list):
        raise InvalidMessages("system must be a string or a list of text blocks", field="system")
    blocks: list[Block] = []
    hints: list[dict[str, Any]] = []
    for j, item in enumerate(system):
        block, hint = _parse_block(item, f"system[{j}]", "system", {})
        if not isinstance(block, TextBlock):
            raise InvalidMessages("the system prompt may hold only text blocks", field=f"system[{j}].type")
        blocks.append(block)
        hints.append(hint)
    return _with_hints("system", blocks, hints, None)


def from_anthropic(
    messages: list[dict[str, Any]],
    system: str | list[Any] | None = None,
    *,
    known_calls: Mapping[str, str] | None = None,
) -> list[Message]:
    """Convert an Anthropic ``messages`` list (and optional ``system``).

    ``known_calls`` (id -> tool name) lists calls from an earlier batch, so
    appending only results is not taken for an orphan.
    """
    if not isinstance(messages, list):
        raise InvalidMessages("messages must be a list of message objects", field="messages")
    out: list[Message] = []
    head = _system_message(system)
    if head is not None:
        out.append(head)
    call_names: dict[str, str] = dict(known_calls or {})
    for index, data in enumerate(messages):
        converted = parse_anthropic_message(data, index, call_names)
        if isinstance(data.get("content"), list):
            for j, item in enumerate(data["content"]):
                if isinstance(item, dict) and item.get("type") == "tool_result":
                    call_id = item["tool_use_id"]
                    if call_id not in call_names:
                        raise InvalidMessages(
                            f"orphan tool result: no earlier tool_use has id {call_id!r}",
                            field=f"messages[{index}].content[{j}].tool_use_id",
                        )
        out.extend(converted)
    return out


# -- writing --------------------------------------------------------------------------


def _source(block: MediaBlock, hint: Mapping[str, Any]) -> dict[str, Any]:
    if hint.get("source") == "file" and block.url is not None:
        return {"type": "file", "file_id": block.url}
    if block.data is not None:
        source_type = "text" if hint.get("source") == "text" else "base64"
        return {"type": source_type, "media_type": block.media_type or "", "data": block.data}
    return {"type": "url", "url": block.url or ""}


def _render_media(block: MediaBlock, hint: Mapping[str, Any]) -> dict[str, Any]:
    if block.kind == "image":
        return {"type": "image", "source": _source(block, hint)}
    if block.kind == "file":
        return {"type": "document", "source": _source(block, hint)}
    # The Messages API has no audio or video input: say what was there.
    return {"type": "text", "text": f"[{block.kind}: {block.url or block.media_type or 'inline data'}]"}


def _hint_fits(block: Block, hint: Mapping[str, Any]) -> bool:
    kind = hint.get("type")
    if isinstance(block, TextBlock):
        return kind == "text"
    if isinstance(block, ThinkingBlock):
        return kind in ("thinking", "redacted_thinking")
    if isinstance(block, ToolUseBlock):
        return kind == "tool_use"
    if isinstance(block, ToolResultBlock):
        return kind == "tool_result"
    return kind == ("image" if block.kind == "image" else "document")


def _render_block(block: Block, hint: Mapping[str, Any]) -> dict[str, Any] | None:
    out: dict[str, Any]
    if isinstance(block, TextBlock):
        out = {"type": "text", "text": block.text}
    elif isinstance(block, ThinkingBlock):
        if hint.get("type") == "redacted_thinking":
            out = {"type": "redacted_thinking"}
        elif "signature" in hint.get("extra", {}):
            out = {"type": "thinking", "thinking": block.thinking}
        else:
            # The API refuses thinking it did not sign (reasoning from another
            # provider, say), so unsigned thinking stays out of the payload.
            return None
    elif isinstance(block, ToolUseBlock):
        out = {"type": "tool_use", "id": block.id, "name": block.name, "input": dict(block.input)}
    elif isinstance(block, ToolResultBlock):
        out = {"type": "tool_result", "tool_use_id": block.id}
        if isinstance(block.output, str):
            if block.output or not hint.get("no_content"):
                out["content"] = block.output
        else:
            out["content"] = [
                {"type": "text", "text": p.text} if isinstance(p, TextBlock) else _render_media(p, {})
                for p in block.output
            ]
        if block.is_error or hint.get("explicit_is_error"):
            out["is_error"] = block.is_error
    else:
        out = _render_media(block, hint)
    for key, value in hint.get("extra", {}).items():
        out.setdefault(key, value)
    return out


def _render_blocks(msg: Message) -> list[dict[str, Any]]:
    raw = msg.metadata.get(HINTS_KEY)
    meta: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
    hints = meta.get("blocks")
    fits = (
        isinstance(hints, list)
        and len(hints) == len(msg.content)
        and all(_hint_fits(b, h) for b, h in zip(msg.content, hints, strict=True))
    )
    rendered: list[dict[str, Any]] = []
    for j, block in enumerate(msg.content):
        hint = hints[j] if fits and isinstance(hints, list) else {}
        item = _render_block(block, hint)
        if item is not None:
            rendered.append(item)
    return rendered


def to_anthropic(messages: Sequence[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """(system prompt, messages) for the Messages API.

    Leading system messages become the system prompt. A system message later in
    the conversation (a compaction note, say) has no place in the API, so it is
    sent as user text where it stands rather than moved out of order.
    """
    system_parts: list[str] = []
    entries: list[tuple[str, list[dict[str, Any]], bool]] = []  # role, blocks, may be a string
    started = False
    for msg in messages:
        if msg.role == "system" and not started:
            system_parts.append("\n".join(b.text for b in msg.content if isinstance(b, TextBlock)))
            continue
        started = True
        blocks = _render_blocks(msg)
        if msg.role == "system":
            blocks = [b for b in blocks if b.get("type") != "thinking"]
        if not blocks:
            continue  # the API refuses empty messages
        role = "assistant" if msg.role == "assistant" else "user"
        raw = msg.metadata.get(HINTS_KEY)
        as_string = (
            isinstance(raw, dict)
            and raw.get("content") == "string"
            and len(blocks) == 1
            and set(blocks[0]) == {"type", "text"}
        )
        if entries and entries[-1][0] == role:
            prev_role, prev_blocks, _ = entries[-1]
            entries[-1] = (prev_role, prev_blocks + blocks, False)
        else:
            entries.append((role, blocks, as_string))
    out: list[dict[str, Any]] = []
    for role, blocks, as_string in entries:
        if role == "user":
            # The API wants a user turn's tool results before anything else in it.
            blocks = [b for b in blocks if b.get("type") == "tool_result"] + [
                b for b in blocks if b.get("type") != "tool_result"
            ]
        content: Any = blocks[0]["text"] if as_string else blocks
        out.append({"role": role, "content": content})
    system = "\n\n".join(system_parts) if system_parts else None
    return system, out
