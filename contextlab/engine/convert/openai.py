"""OpenAI chat-completions messages to and from the engine's message model.

The round trip OpenAI -> internal -> OpenAI must give back exactly the dicts
that came in, for every field the provider accepts. The internal model cannot
hold everything OpenAI can say (whether content was a string or a list of
parts, ``null`` content on a tool-call message, ``detail`` on an image, keys we
have never heard of), so ``from_openai`` records whatever the plain rendering
would not reproduce in ``metadata["openai"]`` and ``to_openai`` reads it back.

Hints are only applied while they still fit the content: once a message has
been rewritten (a truncated tool result, say), a part hint whose shape no longer
matches is ignored and the plain rendering is used instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from contextlab.engine.convert._blocks import str_field
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
from contextlab.engine.core.unicode import repaired

HINTS_KEY = "openai"

# "developer" is OpenAI's newer name for the system role; it is the same thing
# to the engine, and the hint gives the original spelling back.
_ROLE_MAP: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
# Keys each role understands; anything else is kept verbatim as an "extra".
_PARSED_KEYS: dict[str, frozenset[str]] = {
    "system": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset({"role", "content", "name", "tool_calls", "reasoning_content"}),
    "tool": frozenset({"role", "content", "name", "tool_call_id"}),
}
_DATA_URL = re.compile(r"data:([^;,]*);base64,(.*)", re.DOTALL)


# -- reading --------------------------------------------------------------------------


def _object_field(data: Mapping[str, Any], key: str, where: str, message: str) -> dict[str, Any]:
    """``data[key]``, which must be an object; if it is not, ``message`` is the error, at ``where.key``."""
    value = data.get(key)
    if not isinstance(value, dict):
        raise InvalidMessages(message, field=f"{where}.{key}")
    return value


def _split_data_url(value: str) -> tuple[str | None, str | None, str | None]:
    """(url, media_type, data): a ``data:`` URL is kept as media type + base64."""
    match = _DATA_URL.fullmatch(value)
    if match:
        return None, match.group(1), match.group(2)
    return value, None, None


def _parse_part(part: Any, where: str) -> tuple[TextBlock | MediaBlock, dict[str, Any]]:
    """One content part and its hint: the part type plus keys we do not model."""
    if not isinstance(part, dict):
        raise InvalidMessages("a content part must be an object", field=where)
    kind = part.get("type")
    hint: dict[str, Any] = {"type": kind}
    if kind == "text":
        block: TextBlock | MediaBlock = TextBlock(str_field(part, "text", where))
        known = {"type", "text"}
    elif kind == "refusal":
        block = TextBlock(str_field(part, "refusal", where))
        known = {"type", "refusal"}
    elif kind == "image_url":
        inner = part.get("image_url")
        if isinstance(inner, str):
            # Some SDKs accept the bare URL string; remember that form.
            hint["inner"] = "string"
            url, media_type, data = _split_data_url(inner)
        elif isinstance(inner, dict):
            url, media_type, data = _split_data_url(str_field(inner, "url", f"{where}.image_url"))
            inner_extra = {k: v for k, v in inner.items() if k != "url"}
            if inner_extra:
                hint["inner_extra"] = inner_extra
        else:
            raise InvalidMessages("image_url must be an object with a url", field=f"{where}.image_url")
        block = MediaBlock(kind="image", url=url, media_type=media_type, data=data)
        known = {"type", "image_url"}
    elif kind == "input_audio":
        inner = _object_field(part, "input_audio", where, "input_audio must be an object")
        data_value = str_field(inner, "data", f"{where}.input_audio")
        fmt = inner.get("format")
        block = MediaBlock(
            kind="audio", data=data_value, media_type=f"audio/{fmt}" if isinstance(fmt, str) else None
        )
        inner_extra = {k: v for k, v in inner.items() if k not in ("data", "format")}
        if not isinstance(fmt, str) and "format" in inner:
            inner_extra["format"] = fmt
        if inner_extra:
            hint["inner_extra"] = inner_extra
        known = {"type", "input_audio"}
    elif kind == "file":
        inner = _object_field(part, "file", where, "file must be an object")
        file_id = inner.get("file_id")
        file_data = inner.get("file_data")
        media_type = data = None
        if isinstance(file_data, str):
            _, media_type, data = _split_data_url(file_data)
            if data is None:
                data = file_data
        block = MediaBlock(
            kind="file", url=file_id if isinstance(file_id, str) else None, media_type=media_type, data=data
        )
        inner_extra = {
            k: v
            for k, v in inner.items()
            if not (k == "file_id" and isinstance(v, str)) and not (k == "file_data" and isinstance(v, str))
        }
        if inner_extra:
            hint["inner_extra"] = inner_extra
        known = {"type", "file"}
    else:
        raise InvalidMessages(
            f"unknown content part type {kind!r}; expected text, image_url, input_audio, file or refusal",
            field=f"{where}.type",
        )
    extra = {k: v for k, v in part.items() if k not in known}
    if extra:
        hint["extra"] = extra
    return block, hint


def _parse_content(
    content: Any, where: str
) -> tuple[list[TextBlock | MediaBlock], str, list[dict[str, Any]]]:
    if content is None:
        return [], "null", []
    if isinstance(content, str):
        return ([TextBlock(content)] if content else []), "string", []
    if isinstance(content, list):
        blocks: list[TextBlock | MediaBlock] = []
        hints: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            block, hint = _parse_part(part, f"{where}[{j}]")
            blocks.append(block)
            hints.append(hint)
        return blocks, "parts", hints
    raise InvalidMessages("content must be a string, a list of parts or null", field=where)


def _parse_tool_call(call: Any, where: str) -> tuple[ToolUseBlock, dict[str, Any]]:
    if not isinstance(call, dict):
        raise InvalidMessages("a tool call must be an object", field=where)
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidMessages("a tool call needs a non-empty string id", field=f"{where}.id")
    hint: dict[str, Any] = {}
    call_type = call.get("type", "function")
    if "type" not in call:
        hint["no_type"] = True
    if call_type == "custom":
        body = _object_field(call, "custom", where, "a custom tool call needs a custom object")
        name = str_field(body, "name", f"{where}.custom")
        raw = body.get("input")
        block = ToolUseBlock(
            id=call_id, name=name, input={}, raw_input=raw if isinstance(raw, str) else None
        )
        hint["type"] = "custom"
        fn_extra = {k: v for k, v in body.items() if k not in ("name", "input")}
        body_key = "custom"
    else:
        body = _object_field(call, "function", where, "a tool call needs a function object")
        name = str_field(body, "name", f"{where}.function")
        arguments = body.get("arguments")
        if isinstance(arguments, str):
            block = ToolUseBlock(id=call_id, name=name, input=parse_arguments(arguments), raw_input=arguments)
        elif isinstance(arguments, dict):
            # Not what the API sends, but some clients do; keep it as an object.
            block = ToolUseBlock(id=call_id, name=name, input=dict(arguments))
            hint["args"] = "object"
        elif arguments is None:
            block = ToolUseBlock(id=call_id, name=name, input={})
            hint["args"] = "null" if "arguments" in body else "absent"
        else:
            raise InvalidMessages(
                "function.arguments must be a JSON string", field=f"{where}.function.arguments"
            )
        if call_type != "function":
            hint["type"] = call_type
        fn_extra = {k: v for k, v in body.items() if k not in ("name", "arguments")}
        body_key = "function"
    if fn_extra:
        hint["fn_extra"] = fn_extra
    extra = {k: v for k, v in call.items() if k not in ("id", "type", body_key)}
    if extra:
        hint["extra"] = extra
    return block, hint


def parse_arguments(arguments: str) -> dict[str, Any]:
    """The parsed arguments, or ``{}`` when the model wrote something that is not a JSON object.

    Models do emit broken JSON; the raw string stays on the block so nothing is lost.
    """
    try:
        # NaN, Infinity and numbers too large for a float are not JSON a
        # provider accepts (and cannot be stored in a JSON column): treat the
        # arguments as unparsed, the raw string still holds them.
        value = json.loads(arguments, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError):
        return {}
    return repaired(value) if isinstance(value, dict) else {}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is too large for a float")
    return value


def _default_content_form(role: str, visible: Sequence[Block], has_calls: bool) -> str:
    if any(isinstance(b, MediaBlock) for b in visible) or len(visible) > 1:
        return "parts"
    if role == "assistant" and not visible and has_calls:
        return "null"
    return "string"


def parse_openai_message(
    data: Any, index: int, call_names: dict[str, str], *, path: str = "messages"
) -> Message:
    """Convert one OpenAI message; ``call_names`` maps tool call ids seen so far to names.

    Orphan results are not checked here (importers repair them); ``from_openai`` does.
    """
    where = f"{path}[{index}]"
    if not isinstance(data, dict):
        raise InvalidMessages("a message must be an object", field=where)
    raw_role = data.get("role")
    if not isinstance(raw_role, str) or raw_role not in _ROLE_MAP:
        raise InvalidMessages(
            f"unknown role {raw_role!r}; expected system, developer, user, assistant or tool",
            field=f"{where}.role",
        )
    role = _ROLE_MAP[raw_role]
    hints: dict[str, Any] = {}
    if raw_role == "developer":
        hints["role"] = "developer"
    parsed = _PARSED_KEYS[role]

    name = data.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidMessages("name must be a string", field=f"{where}.name")

    content_key_present = "content" in data
    visible, form, part_hints = _parse_content(data.get("content"), f"{where}.content")
    if not content_key_present:
        form = "absent"

    blocks: list[Block] = []
    call_hints: list[dict[str, Any]] = []
    extra = {k: v for k, v in data.items() if k not in parsed}
    if "name" in data and name is None:
        extra["name"] = None  # an explicit null, given back as it came
    if role == "assistant":
        reasoning = data.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            blocks.append(ThinkingBlock(reasoning))
        elif "reasoning_content" in data:
            # "" or null: nothing to think about, but give the key back as it was.
            if reasoning is not None and not isinstance(reasoning, str):
                raise InvalidMessages("reasoning_content must be a string", field=f"{where}.reasoning_content")
            extra["reasoning_content"] = reasoning
        blocks.extend(visible)
        calls = data.get("tool_calls")
        if isinstance(calls, list) and calls:
            for j, call in enumerate(calls):
                block, hint = _parse_tool_call(call, f"{where}.tool_calls[{j}]")
                blocks.append(block)
                call_hints.append(hint)
                call_names[block.id] = block.name
        elif calls is not None and not isinstance(calls, list):
            raise InvalidMessages("tool_calls must be a list", field=f"{where}.tool_calls")
        elif "tool_calls" in data:
            extra["tool_calls"] = calls  # [] or null, given back verbatim
        has_calls = bool(call_hints)
    elif role == "tool":
        call_id = data.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidMessages("a tool message needs a tool_call_id", field=f"{where}.tool_call_id")
        output: str | tuple[ResultPart, ...]
        output = tuple(visible) if form == "parts" else "".join(b.text for b in visible if isinstance(b, TextBlock))
        result_name = call_names.get(call_id) or (name or "")
        blocks.append(ToolResultBlock(id=call_id, name=result_name, output=output))
        has_calls = False
    else:
        blocks.extend(visible)
        has_calls = False

    if role == "tool":
        default_form = "parts" if form == "parts" else "string"
    else:
        default_form = _default_content_form(role, visible, has_calls)
    if form != default_form or form == "parts":
        # "parts" is kept even when it is the default, so that a message later
        # cut down to one text block still goes back as a list.
        hints["content"] = form
    if form == "parts" and any(_part_hint_matters(h) for h in part_hints):
        hints["parts"] = part_hints
    if any(call_hints):
        hints["calls"] = call_hints
    if extra:
        hints["extra"] = extra
    metadata: dict[str, Any] = {HINTS_KEY: hints} if hints else {}
    return Message(role=role, content=tuple(blocks), name=name, metadata=metadata)


def _part_hint_matters(hint: Mapping[str, Any]) -> bool:
    return set(hint) != {"type"} or hint["type"] == "refusal"


def from_openai(
    messages: list[dict[str, Any]], *, known_calls: Mapping[str, str] | None = None
) -> list[Message]:
    """Convert OpenAI chat messages; a tool message must answer an earlier call.

    ``known_calls`` (id -> tool name) lists calls from an earlier batch of the same
    conversation, so that appending only the results is not taken for an orphan.
    """
    if not isinstance(messages, list):
        raise InvalidMessages("messages must be a list of message objects", field="messages")
    call_names: dict[str, str] = dict(known_calls or {})
    out: list[Message] = []
    for index, data in enumerate(messages):
        msg = parse_openai_message(data, index, call_names)
        for result in msg.tool_results:
            if result.id not in call_names:
                raise InvalidMessages(
                    f"orphan tool result: no earlier assistant tool call has id {result.id!r}",
                    field=f"messages[{index}].tool_call_id",
                )
        out.append(msg)
    return out


# -- writing --------------------------------------------------------------------------


def _render_part(block: TextBlock | MediaBlock, hint: Mapping[str, Any] | None) -> dict[str, Any]:
    kind = hint.get("type") if hint else None
    if isinstance(block, TextBlock):
        part: dict[str, Any] = (
            {"type": "refusal", "refusal": block.text} if kind == "refusal" else {"type": "text", "text": block.text}
        )
    elif block.kind == "image":
        url = block.url if block.url is not None else f"data:{block.media_type or ''};base64,{block.data or ''}"
        if hint and hint.get("inner") == "string":
            part = {"type": "image_url", "image_url": url}
        else:
            part = {"type": "image_url", "image_url": {"url": url, **(hint or {}).get("inner_extra", {})}}
    elif block.kind == "audio" and block.data is not None:
        inner: dict[str, Any] = {"data": block.data}
        if block.media_type:
            inner["format"] = block.media_type.split("/", 1)[-1]
        part = {"type": "input_audio", "input_audio": {**inner, **(hint or {}).get("inner_extra", {})}}
    elif block.kind == "file":
        file_inner: dict[str, Any] = {}
        if block.url is not None:
            file_inner["file_id"] = block.url
        if block.data is not None:
            file_inner["file_data"] = (
                f"data:{block.media_type};base64,{block.data}" if block.media_type is not None else block.data
            )
        part = {"type": "file", "file": {**file_inner, **(hint or {}).get("inner_extra", {})}}
    else:
        # OpenAI chat has no part for audio by URL or for video: say what was there.
        part = {"type": "text", "text": f"[{block.kind}: {block.url or block.media_type or 'inline data'}]"}
    if hint:
        for key, value in hint.get("extra", {}).items():
            part.setdefault(key, value)
    return part


def _hint_fits(block: Block, hint: Mapping[str, Any]) -> bool:
    kind = hint.get("type")
    if isinstance(block, TextBlock):
        return kind in ("text", "refusal")
    if isinstance(block, MediaBlock):
        return {"image_url": "image", "input_audio": "audio", "file": "file"}.get(str(kind)) == block.kind
    return False


def _render_content(
    visible: Sequence[TextBlock | MediaBlock], form: str, hints: Mapping[str, Any]
) -> tuple[bool, Any]:
    """(include the key?, value) for the ``content`` key."""
    if not visible:
        if form == "absent":
            return False, None
        if form == "null":
            return True, None
        if form == "parts":
            return True, []
        return True, ""
    if form != "parts" and all(isinstance(b, TextBlock) for b in visible):
        return True, "\n".join(b.text for b in visible if isinstance(b, TextBlock))
    part_hints = hints.get("parts")
    fits = (
        isinstance(part_hints, list)
        and len(part_hints) == len(visible)
        and all(_hint_fits(b, h) for b, h in zip(visible, part_hints, strict=True))
    )
    return True, [
        _render_part(b, part_hints[j] if fits and isinstance(part_hints, list) else None)
        for j, b in enumerate(visible)
    ]


def _render_call(block: ToolUseBlock, hint: Mapping[str, Any]) -> dict[str, Any]:
    if hint.get("type") == "custom":
        body: dict[str, Any] = {"name": block.name, "input": block.raw_input or ""}
        call: dict[str, Any] = {"id": block.id, "type": "custom", "custom": body}
    else:
        body = {"name": block.name}
        args_form = hint.get("args")
        if args_form == "object" and block.raw_input is None:
            body["arguments"] = dict(block.input)
        elif args_form == "null" and block.raw_input is None and not block.input:
            body["arguments"] = None
        elif args_form == "absent" and block.raw_input is None and not block.input:
            pass
        else:
            body["arguments"] = (
                block.raw_input if block.raw_input is not None else json.dumps(block.input, ensure_ascii=False)
            )
        call = {"id": block.id, "type": hint.get("type", "function"), "function": body}
        if hint.get("no_type"):
            del call["type"]
    body.update({k: v for k, v in hint.get("fn_extra", {}).items() if k not in body})
    for key, value in hint.get("extra", {}).items():
        call.setdefault(key, value)
    return call


def _result_content(result: ToolResultBlock, form: str, hints: Mapping[str, Any]) -> tuple[bool, Any]:
    if isinstance(result.output, str):
        if form == "null" and not result.output:
            return True, None
        if form == "absent" and not result.output:
            return False, None
        if form == "parts":
            visible: list[TextBlock | MediaBlock] = [TextBlock(result.output)] if result.output else []
            return _render_content(visible, "parts", hints)
        return True, result.output
    return _render_content(list(result.output), "parts", hints)


def message_to_openai(msg: Message) -> list[dict[str, Any]]:
    """One internal message as one or more OpenAI messages (one per tool result)."""
    raw_hints = msg.metadata.get(HINTS_KEY)
    hints: Mapping[str, Any] = raw_hints if isinstance(raw_hints, dict) else {}
    results = msg.tool_results
    out: list[dict[str, Any]] = []
    if results:
        # Hints describe a single OpenAI message; a merged one gets the plain form.
        single = hints if len(results) == 1 else {}
        for result in results:
            item: dict[str, Any] = {"role": "tool", "tool_call_id": result.id}
            include, value = _result_content(result, str(single.get("content", "")), single)
            if include:
                item["content"] = value
            if msg.name is not None:
                item["name"] = msg.name
            for key, extra_value in single.get("extra", {}).items():
                item.setdefault(key, extra_value)
            out.append(item)
        rest = [b for b in msg.content if not isinstance(b, ToolResultBlock)]
        if rest:
            # Text that travelled with tool results (Anthropic allows that) follows them.
            rest_role: Role = msg.role if msg.role != "tool" else "user"
            out.extend(message_to_openai(Message(role=rest_role, content=tuple(rest), id=msg.id)))
        return out

    visible = [b for b in msg.content if isinstance(b, TextBlock | MediaBlock)]
    thinking = [b.thinking for b in msg.content if isinstance(b, ThinkingBlock)]
    uses = msg.tool_uses
    role: str = str(hints.get("role", "system")) if msg.role == "system" else msg.role
    if msg.role == "tool":
        role = "user"  # a tool message without a result can only be user text
    form = str(hints.get("content") or _default_content_form(msg.role, visible, bool(uses)))
    item = {"role": role}
    include, value = _render_content(visible, form, hints)
    if include:
        item["content"] = value
    if msg.name is not None:
        item["name"] = msg.name
    if msg.role == "assistant":
        if thinking:
            item["reasoning_content"] = "\n".join(thinking)
        if uses:
            call_hints = hints.get("calls")
            fits = isinstance(call_hints, list) and len(call_hints) == len(uses)
            item["tool_calls"] = [
                _render_call(u, call_hints[j] if fits and isinstance(call_hints, list) else {})
                for j, u in enumerate(uses)
            ]
    for key, extra_value in hints.get("extra", {}).items():
        item.setdefault(key, extra_value)
    out.append(item)
    return out


# Converted forms kept between calls: message object id -> (the message, its OpenAI messages).
OpenAIForms = dict[int, tuple[Message, list[dict[str, Any]]]]


def to_openai(messages: Sequence[Message], forms: OpenAIForms | None = None) -> list[dict[str, Any]]:
    """Internal messages as OpenAI chat messages.

    Tool results become one ``tool`` message each; thinking goes to
    ``reasoning_content``; ``is_error`` has no OpenAI field and is not sent.

    ``forms``: what the previous call converted (updated in place). Messages are
    immutable, so a message object converted before is not converted again:
    a payload of mostly the same live messages costs a pass of lookups, not a
    conversion of every message. The returned dicts are then shared with
    ``forms``: copy one before changing it.
    """
    if forms is None:
        out: list[dict[str, Any]] = []
        for msg in messages:
            out.extend(message_to_openai(msg))
        return out
    out = []
    seen: OpenAIForms = {}
    for msg in messages:
        entry = forms.get(id(msg))
        if entry is None or entry[0] is not msg:
            entry = (msg, message_to_openai(msg))
        seen[id(msg)] = entry
        out.extend(entry[1])
    # Only what this payload holds stays: the entry keeps its message alive, so its id is not reused.
    forms.clear()
    forms.update(seen)
    return out
