"""Terminal escape codes taken out of the text a summary is written from.

Tool output captured from a terminal carries colour and cursor codes
(``\\x1b[2m…\\x1b[0m``). A summary that copies them shows them raw on every
page and to the model, and an LLM summariser spends tokens on them. The
archive keeps the original output untouched; only the summary's input is
cleaned (see ``SummaryRequest``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from contextlab.engine.core.messages import Block, Message, TextBlock, ThinkingBlock, ToolResultBlock

# CSI sequences (colours, cursor moves), OSC sequences (window titles,
# hyperlinks) ended by BEL or ST, character-set designations ("\x1b(B", which
# `tput sgr0` writes) and the two-character escapes.
ANSI_ESCAPE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]+[0-~]|\x1b[@-Z\\-_]"
)


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape codes (the same object when it has none)."""
    return ANSI_ESCAPE.sub("", text) if "\x1b" in text else text


def _clean_block(block: Block) -> Block:
    if isinstance(block, TextBlock) and "\x1b" in block.text:
        return TextBlock(strip_ansi(block.text))
    if isinstance(block, ThinkingBlock) and "\x1b" in block.thinking:
        return dataclasses.replace(block, thinking=strip_ansi(block.thinking))
    if isinstance(block, ToolResultBlock):
        if isinstance(block.output, str):
            if "\x1b" in block.output:
                return dataclasses.replace(block, output=strip_ansi(block.output))
        elif any(isinstance(p, TextBlock) and "\x1b" in p.text for p in block.output):
            parts = tuple(TextBlock(strip_ansi(p.text)) if isinstance(p, TextBlock) else p for p in block.output)
            return dataclasses.replace(block, output=parts)
    return block


def without_ansi(messages: Sequence[Message]) -> list[Message]:
    """The messages with escape codes removed from text, thinking and tool output.

    Messages without any are returned as they are (same objects), so the
    common case costs one substring scan per block.
    """
    out: list[Message] = []
    for message in messages:
        blocks = [_clean_block(b) for b in message.content]
        if all(new is old for new, old in zip(blocks, message.content, strict=True)):
            out.append(message)
        else:
            out.append(dataclasses.replace(message, content=tuple(blocks), _token_memo={}))
    return out
