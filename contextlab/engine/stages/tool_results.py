"""Small facts about tool calls and their results that truncation needs.

Which argument names a path, where a read_file excerpt starts in its file,
whether it reads Markdown, and how a list output is laid out so that its
original can be rebuilt exactly from one offloaded text.
"""

from __future__ import annotations

import json

from contextlab.engine.core.errors import InvalidMessages
from contextlab.engine.core.messages import (
    Block,
    MediaBlock,
    Message,
    ResultPart,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextlab.engine.core.profile import Profile

PATH_KEYS = ("file_path", "path", "filename", "file", "target_file")
START_KEYS = ("start_line", "offset", "line", "view_range")


def block_text(block: Block) -> str:
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, ToolResultBlock):
        return block.output_text()
    if isinstance(block, ToolUseBlock):
        return block.raw_input or json.dumps(block.input, ensure_ascii=False)
    if isinstance(block, MediaBlock):
        return block.data or block.url or ""
    return block.thinking


def check_utf8(msg: Message, index: int) -> None:
    """Lone surrogates (what invalid UTF-8 becomes after a lenient decode) are refused."""
    for block in msg.content:
        text = block_text(block)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidMessages(
                f"message {msg.id!r} holds text that is not valid UTF-8 (at character {exc.start})",
                field=f"messages[{index}].content",
            ) from exc


def layout_of(block: ToolResultBlock) -> list[dict[str, int]] | None:
    if isinstance(block.output, str):
        return None
    layout: list[dict[str, int]] = []
    media = 0
    for part in block.output:
        if isinstance(part, TextBlock):
            layout.append({"text": len(part.text)})
        else:
            layout.append({"media": media})
            media += 1
    return layout


def rebuild_parts(full: str, layout: list[dict[str, int]] | None,
                   media: list[MediaBlock]) -> tuple[ResultPart, ...]:
    """Split the offloaded text back into the parts it was joined from."""
    if not layout:
        return (TextBlock(full), *media)
    parts: list[ResultPart] = []
    position = 0
    for item in layout:
        if "text" in item:
            parts.append(TextBlock(full[position:position + item["text"]]))
            position += item["text"] + 1  # the "\n" that joined the parts
        else:
            parts.append(media[item["media"]])
    return tuple(parts)


def is_markdown_read(call: ToolUseBlock, profile: Profile) -> bool:
    if call.name not in profile.read_file_tool_names:
        return False
    path = path_argument(call)
    return path is not None and path.lower().endswith((".md", ".markdown", ".mdx"))


def path_argument(call: ToolUseBlock) -> str | None:
    for key in PATH_KEYS:
        value = call.input.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def read_file_origin(call: ToolUseBlock | None, profile: Profile) -> tuple[str | None, int]:
    """For read_file-like tools: the real file and the line the result starts at."""
    if call is None or call.name not in profile.read_file_tool_names:
        return None, 1
    path = path_argument(call)
    start = 1
    for key in START_KEYS:
        value = call.input.get(key)
        if isinstance(value, list) and value and isinstance(value[0], int):
            value = value[0]
        if isinstance(value, int) and value > 0:
            start = value
            break
    return path, start
