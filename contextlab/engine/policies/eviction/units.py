"""Information units: the pieces of a context that eviction scores and acts on.

A message becomes one unit, except when it holds several things that can live
or go separately: each tool call and each tool result is its own unit, and the
rest of the message (text, thinking, media) is one more. Such units are named
``<message id>#<block index>``; a single-unit message's unit is named by the
message id alone.

Units of one tool round (an assistant message with calls and the messages
carrying their results) share a ``group``: the round can only leave the
context as a whole, because a provider rejects a call without its result and a
result without its call (seed 003 §5.1, "强化依赖链").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from contextlab.engine.core.messages import (
    Block,
    MediaBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextlab.engine.memory.working import describe_call, is_request, one_line

UnitType = Literal["system_note", "user_request", "assistant_text", "tool_call", "tool_result", "summary", "recollection"]
UNIT_TYPES: tuple[str, ...] = (
    "system_note", "user_request", "assistant_text", "tool_call", "tool_result", "summary", "recollection",
)
Layer = Literal["core", "working", "summary"]

# Metadata key our placeholders and in-place replacements carry (see apply.py).
EVICTION_META = "eviction"


@dataclass(frozen=True)
class InformationUnit:
    id: str
    type: UnitType
    message_ids: tuple[str, ...]
    tokens: int
    timestamp: str
    position: int  # index of its message in the list it was built from
    block: int | None = None  # first block of the unit inside its message; None: the whole message
    parent: str | None = None  # a tool_result's tool_call unit
    group: str | None = None  # the tool round it belongs to
    tool_name: str | None = None
    tool_call_id: str | None = None
    label: str = ""  # 'tool_result of bash "pytest -q"'
    user_turn: bool = False  # a request a person wrote (not a summary, recollection or tool result)
    evicted_before: bool = False  # already a placeholder or an in-place summary
    text: str = field(default="", repr=False)  # what relevance and density are computed on
    # -- scoring features (score_units fills them) --
    relevance: float = 0.0
    recency: float = 0.0
    density: float = 0.0
    score: float = 0.0
    score_parts: dict[str, float] = field(default_factory=dict)
    core: bool = False
    core_reason: str | None = None
    layer: Layer = "working"

    @property
    def message_id(self) -> str:
        return self.message_ids[0]


def _block_text(block: Block) -> str:
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, ThinkingBlock):
        return block.thinking
    if isinstance(block, ToolUseBlock):
        return f"{block.name} {block.raw_input or json.dumps(block.input, ensure_ascii=False)}"
    if isinstance(block, ToolResultBlock):
        return block.output_text()
    if isinstance(block, MediaBlock):
        return block.url or ""
    return ""


def message_kind(message: Message) -> UnitType:
    """The type of a message's non-tool content."""
    meta = message.metadata
    if message.role == "system":
        return "system_note"
    if message.name == "recollection" or meta.get("layer") == "recollection":
        return "recollection"
    if (message.name == "summary" or meta.get("layer") in ("summary", "eviction") or meta.get("compact_summary")
            or (EVICTION_META in meta and not message.tool_results)):
        return "summary"
    if message.role == "assistant":
        return "assistant_text"
    return "user_request"


def _split_tokens(total: int, weights: list[int]) -> list[int]:
    """Share a message's tokens among its units in proportion to their text."""
    if not weights:
        return []
    mass = sum(weights)
    if mass <= 0:
        return [total] + [0] * (len(weights) - 1)
    shares = [total * w // mass for w in weights]
    # The rounding remainder goes to the largest unit, so the sum is exact.
    shares[max(range(len(weights)), key=lambda i: (weights[i], -i))] += total - sum(shares)
    return shares


def tool_groups(messages: Sequence[Message]) -> dict[str, str]:
    """message id -> round id, for messages that hold tool calls or results.

    A round is the connected set of messages linked by call ids (union-find):
    normally one assistant message and the messages with its results.
    """
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    call_owner: dict[str, str] = {}
    order: dict[str, int] = {}
    for index, msg in enumerate(messages):
        if msg.tool_uses or msg.tool_results:
            parent.setdefault(msg.id, msg.id)
            order.setdefault(msg.id, index)
        for use in msg.tool_uses:
            call_owner.setdefault(use.id, msg.id)
    for msg in messages:
        for res in msg.tool_results:
            owner = call_owner.get(res.id)
            if owner is not None:
                a, b = find(owner), find(msg.id)
                if a != b:
                    # The earlier message names the round: its id is stable as the round grows.
                    first, second = (a, b) if order[a] <= order[b] else (b, a)
                    parent[second] = first
    return {mid: f"round:{find(mid)}" for mid in parent}


def build_units(messages: Sequence[Message], tokens: Sequence[int]) -> list[InformationUnit]:
    """Units in message order; ``tokens[i]`` is the count of ``messages[i]``."""
    if len(messages) != len(tokens):
        raise ValueError(f"{len(messages)} messages but {len(tokens)} token counts")
    groups = tool_groups(messages)
    call_units: dict[str, tuple[str, str]] = {}  # call id -> (unit id, label)
    units: list[InformationUnit] = []
    for position, (msg, total) in enumerate(zip(messages, tokens, strict=True)):
        kind = message_kind(msg)
        evicted = msg.metadata.get(EVICTION_META) or {}
        evicted_blocks = (evicted.get("blocks") or {}) if isinstance(evicted, dict) else {}
        # Pieces: each call, each result, and the rest of the message as one piece.
        pieces: list[tuple[int, list[Block]]] = []
        rest_index: int | None = None
        rest: list[Block] = []
        for b_index, block in enumerate(msg.content):
            if isinstance(block, ToolUseBlock | ToolResultBlock):
                pieces.append((b_index, [block]))
            else:
                if rest_index is None:
                    rest_index = b_index
                rest.append(block)
        if rest_index is not None or not pieces:
            pieces.insert(0, (rest_index if rest_index is not None else 0, rest))
        pieces.sort(key=lambda p: p[0])
        single = len(pieces) == 1
        shares = _split_tokens(total, [sum(len(_block_text(b)) for b in blocks) + 1 for _, blocks in pieces])
        for (b_index, blocks), share in zip(pieces, shares, strict=True):
            text = "\n".join(_block_text(b) for b in blocks)
            head = blocks[0] if blocks else None
            base = InformationUnit(
                id=msg.id if single else f"{msg.id}#{b_index}", type=kind, message_ids=(msg.id,), tokens=share,
                timestamp=msg.timestamp, position=position, block=None if single else b_index,
                group=groups.get(msg.id), text=text,
                evicted_before=bool(evicted) and (not evicted_blocks or str(b_index) in evicted_blocks),
            )
            if isinstance(head, ToolUseBlock):
                described = describe_call(head)
                label = f'{head.name} "{described}"' if described else head.name
                call_units[head.id] = (base.id, label)
                units.append(replace(base, type="tool_call", tool_name=head.name, tool_call_id=head.id, label=label))
            elif isinstance(head, ToolResultBlock):
                call = call_units.get(head.id)
                units.append(replace(
                    base, type="tool_result", tool_name=head.name, tool_call_id=head.id,
                    parent=call[0] if call else None, label=f"tool_result of {call[1] if call else head.name}"))
            else:
                user_turn = kind == "user_request" and not msg.tool_results and is_request(msg)
                name = kind.replace("_", " ")
                label = f'{name} "{one_line(text, 60)}"' if text.strip() else name
                units.append(replace(base, label=label, user_turn=user_turn))
    return units
