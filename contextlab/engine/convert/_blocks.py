"""Reading content blocks: the checks every provider converter makes the same way.

Anthropic and AgentScope share the block shapes (``{"type": "text", "text":
...}``, a tool_use block with ``id``, ``name`` and ``input``, a tool result whose
output is a string or a list of text and media blocks); OpenAI shares the way a
required string field is checked. The error messages and field paths are part
of the API (the ingest endpoint returns them), so every converter must word
them alike; they are written here once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from contextlab.engine.core.errors import InvalidMessages
from contextlab.engine.core.messages import MediaBlock, ResultPart, TextBlock, ToolUseBlock

MediaParser = Callable[[Mapping[str, Any], str], MediaBlock]


def str_field(data: Mapping[str, Any], key: str, where: str) -> str:
    """``data[key]``, which must be a string; the error names ``where.key``."""
    value = data.get(key)
    if not isinstance(value, str):
        raise InvalidMessages(f"{key} must be a string", field=f"{where}.{key}")
    return value


def block_type(item: Any, where: str) -> Any:
    """The ``type`` of a content block, once it is known to be an object."""
    if not isinstance(item, dict):
        raise InvalidMessages("a content block must be an object", field=where)
    return item.get("type")


def parse_tool_use(item: Mapping[str, Any], where: str, *, tool_input: Any, raw_input: Any = None) -> ToolUseBlock:
    """A tool_use block, checked field by field.

    ``tool_input`` is the block's input as the provider reads it (AgentScope
    takes any empty value for no arguments, Anthropic only a missing key);
    ``raw_input`` is AgentScope's alone, so the caller says whether there is one.
    """
    call_id, name = item.get("id"), item.get("name")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidMessages("a tool_use block needs a non-empty string id", field=f"{where}.id")
    if not isinstance(name, str):
        raise InvalidMessages("a tool_use block needs a string name", field=f"{where}.name")
    if not isinstance(tool_input, dict):
        raise InvalidMessages("tool_use input must be an object", field=f"{where}.input")
    if raw_input is not None and not isinstance(raw_input, str):
        raise InvalidMessages("raw_input must be a string", field=f"{where}.raw_input")
    return ToolUseBlock(id=call_id, name=name, input=dict(tool_input), raw_input=raw_input)


def parse_result_output(
    output: Any,
    where: str,
    *,
    key: str,
    media_kinds: tuple[str, ...],
    parse_media: MediaParser,
    accepted: str,
) -> str | tuple[ResultPart, ...]:
    """A tool result's output: a string (None reads as ""), or a list of text and media blocks.

    ``key`` is the provider's name for the field ("output", "content"),
    ``media_kinds`` the block types ``parse_media`` reads (a tuple, not a set:
    a block's ``type`` comes from JSON and may be unhashable), and ``accepted``
    says in the error what the list may hold.
    """
    if output is None:
        return ""
    if isinstance(output, str):
        return output
    if not isinstance(output, list):
        raise InvalidMessages(f"tool_result {key} must be a string or a list of blocks", field=where)
    parts: list[ResultPart] = []
    for j, item in enumerate(output):
        part_where = f"{where}[{j}]"
        kind = block_type(item, part_where)
        if kind == "text":
            parts.append(TextBlock(str_field(item, "text", part_where)))
        elif kind in media_kinds:
            parts.append(parse_media(item, part_where))
        else:
            raise InvalidMessages(
                f"tool_result {key} may hold {accepted}, not {kind!r}", field=f"{part_where}.type"
            )
    return tuple(parts)
