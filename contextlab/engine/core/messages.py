"""The one message model every part of the engine works on.

A message is an immutable value: truncation, archiving and conversion build new
messages instead of editing old ones. That is what lets token counts be cached
on the message itself (see ``tokens.py``) and what keeps the caller's objects
untouched, unlike ReMe, which rewrites AgentScope messages in place.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from contextlab.engine.core.errors import InvalidMessages

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
# Metadata key of a message an importer made up to repair a recorded session
# (e.g. "no_result": the placeholder result of a call that never got one).
# Summaries must not read such a message as something the agent did.
REPAIR_KEY = "repair"


@dataclass(frozen=True, slots=True)
class TextBlock:
    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class ThinkingBlock:
    thinking: str
    type: Literal["thinking"] = "thinking"


@dataclass(frozen=True, slots=True)
class ToolUseBlock:
    id: str
    name: str
    input: dict[str, Any]
    # The arguments exactly as the model produced them (OpenAI's JSON string).
    # Kept so that a round trip through the engine is byte-identical even when
    # the model emitted JSON that re-serialises differently, or invalid JSON.
    raw_input: str | None = None
    type: Literal["tool_use"] = "tool_use"


@dataclass(frozen=True, slots=True)
class MediaBlock:
    """An image, audio, video or file, kept by reference only.

    ``url`` is a link or a path; ``data`` holds inline base64 only when the source
    had it, so a converter can give it back.
    """

    kind: Literal["image", "audio", "video", "file"]
    url: str | None = None
    media_type: str | None = None
    data: str | None = None
    type: Literal["media"] = "media"


ResultPart = TextBlock | MediaBlock


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    id: str
    name: str
    output: str | tuple[ResultPart, ...]
    is_error: bool = False
    type: Literal["tool_result"] = "tool_result"

    def output_text(self) -> str:
        """The text the model reads from this result (media parts are skipped)."""
        if isinstance(self.output, str):
            return self.output
        return "\n".join(p.text for p in self.output if isinstance(p, TextBlock))


Block = TextBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock | MediaBlock


def utc_now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_timestamp(timestamp: str) -> dt.datetime:
    """An aware datetime from our ISO 8601 timestamps (naive ones are UTC)."""
    try:
        moment = dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return dt.datetime.now(dt.UTC)
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def new_message_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the conversation.

    ``metadata`` carries provenance (``source_index``, ``source_format``), the
    offload record of truncated tool results (``offload``) and whatever a
    converter needs to give the message back unchanged.
    """

    role: Role
    content: tuple[Block, ...]
    id: str = field(default_factory=new_message_id)
    name: str | None = None
    timestamp: str = field(default_factory=utc_now_iso)
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # Per-message memo of token counts keyed by counter name; excluded from
    # equality so two identical messages still compare equal.
    _token_memo: dict[str, int] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    # -- constructors -------------------------------------------------------------
    @classmethod
    def text(cls, role: Role, text: str, **kwargs: Any) -> Message:
        return cls(role=role, content=(TextBlock(text),), **kwargs)

    # -- views -------------------------------------------------------------------
    @property
    def tool_uses(self) -> list[ToolUseBlock]:
        return [b for b in self.content if isinstance(b, ToolUseBlock)]

    @property
    def tool_results(self) -> list[ToolResultBlock]:
        return [b for b in self.content if isinstance(b, ToolResultBlock)]

    @property
    def is_tool_result(self) -> bool:
        return any(isinstance(b, ToolResultBlock) for b in self.content)

    @property
    def is_user_turn(self) -> bool:
        """A message a person wrote (not a tool result carried in a user role)."""
        return self.role == "user" and not self.is_tool_result

    @property
    def is_repair(self) -> bool:
        """Made up by an importer's repair pass, not recorded in the session."""
        return bool(self.metadata.get(REPAIR_KEY))

    def plain_text(self) -> str:
        parts: list[str] = []
        for b in self.content:
            if isinstance(b, TextBlock):
                parts.append(b.text)
            elif isinstance(b, ThinkingBlock):
                parts.append(b.thinking)
            elif isinstance(b, ToolResultBlock):
                parts.append(b.output_text())
        return "\n".join(parts)

    def replace_content(self, content: Iterable[Block], **metadata: Any) -> Message:
        """A copy with new content (and merged metadata); the id stays the same."""
        merged = {**self.metadata, **metadata}
        return dataclasses.replace(
            self, content=tuple(content), metadata=merged, _token_memo={}
        )

    def with_metadata(self, **metadata: Any) -> Message:
        merged = {**self.metadata, **metadata}
        return dataclasses.replace(self, metadata=merged, _token_memo=self._token_memo)

    # -- serialisation (our own JSON form, lossless) --------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "role": self.role,
            "name": self.name,
            "timestamp": self.timestamp,
            "content": [block_to_dict(b) for b in self.content],
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        role = data.get("role")
        if role not in ROLES:
            raise InvalidMessages(f"unknown role {role!r}; expected one of {', '.join(ROLES)}", field="role")
        raw_content = data.get("content")
        if not isinstance(raw_content, list):
            raise InvalidMessages("content must be a list of blocks", field="content")
        return cls(
            id=str(data.get("id") or new_message_id()),
            role=role,
            name=data.get("name"),
            timestamp=str(data.get("timestamp") or utc_now_iso()),
            content=tuple(block_from_dict(b) for b in raw_content),
            metadata=dict(data.get("metadata") or {}),
        )


def block_to_dict(block: Block | ResultPart) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ThinkingBlock):
        return {"type": "thinking", "thinking": block.thinking}
    if isinstance(block, ToolUseBlock):
        # A copy: the dict goes to callers (AgentScope code rewrites messages in
        # place) and must not be the frozen block's own.
        out: dict[str, Any] = {"type": "tool_use", "id": block.id, "name": block.name, "input": dict(block.input)}
        if block.raw_input is not None:
            out["raw_input"] = block.raw_input
        return out
    if isinstance(block, ToolResultBlock):
        output: Any = (
            block.output
            if isinstance(block.output, str)
            else [block_to_dict(p) for p in block.output]
        )
        return {
            "type": "tool_result",
            "id": block.id,
            "name": block.name,
            "output": output,
            "is_error": block.is_error,
        }
    media: dict[str, Any] = {"type": block.kind}
    if block.url is not None:
        media["url"] = block.url
    if block.media_type is not None:
        media["media_type"] = block.media_type
    if block.data is not None:
        media["data"] = block.data
    return media


def block_from_dict(data: Any) -> Block:
    if not isinstance(data, dict):
        raise InvalidMessages("a content block must be an object", field="content")
    kind = data.get("type")
    if kind == "text":
        return TextBlock(str(data.get("text", "")))
    if kind == "thinking":
        return ThinkingBlock(str(data.get("thinking", "")))
    if kind in ("tool_use", "tool_result") and not data.get("id"):
        raise InvalidMessages(f"a {kind} block needs an id", field="content")
    if kind == "tool_use":
        return ToolUseBlock(
            id=str(data["id"]),
            name=str(data.get("name", "")),
            input=dict(data.get("input") or {}),
            raw_input=data.get("raw_input"),
        )
    if kind == "tool_result":
        output = data.get("output", "")
        if isinstance(output, list):
            parts: list[ResultPart] = []
            for part in output:
                blk = block_from_dict(part)
                if not isinstance(blk, TextBlock | MediaBlock):
                    raise InvalidMessages("tool_result output may hold only text and media", field="content")
                parts.append(blk)
            output = tuple(parts)
        elif not isinstance(output, str):
            output = str(output)
        return ToolResultBlock(
            id=str(data["id"]),
            name=str(data.get("name", "")),
            output=output,
            is_error=bool(data.get("is_error", False)),
        )
    if kind in ("image", "audio", "video", "file"):
        return MediaBlock(
            kind=kind,
            url=data.get("url"),
            media_type=data.get("media_type"),
            data=data.get("data"),
        )
    raise InvalidMessages(f"unknown content block type {kind!r}", field="content")


# -- sequence checks --------------------------------------------------------------------


def check_sequence(
    messages: Sequence[Message],
    *,
    known_tool_uses: Collection[str] = (),
    known_ids: Collection[str] = (),
    pending_calls: Iterable[str] = (),
    allow_pending_tail: bool = True,
) -> None:
    """Raise InvalidMessages when the messages could not be sent to a provider.

    Checks: duplicate message ids, duplicate tool ids, tool results whose call is
    unknown (orphans), and calls left without a result once the conversation moved
    on to a non-tool message. ``known_*`` and ``pending_calls`` describe the
    messages already in the context, so a batch can be checked on its own. Calls at the very tail may still be waiting for
    their results when ``allow_pending_tail`` is true.
    """
    # The known_* collections are only looked into, never copied: checking a
    # batch must cost the batch, not the whole session.
    new_ids: set[str] = set()
    # Calls still waiting for results from earlier messages: the new messages
    # must answer them before anything else.
    open_calls: dict[str, int] = dict.fromkeys(pending_calls, -1)
    new_calls: set[str] = set()
    for index, msg in enumerate(messages):
        where = f"messages[{index}]"
        if msg.id in new_ids or msg.id in known_ids:
            raise InvalidMessages(f"duplicate message id {msg.id!r}", field=f"{where}.id")
        new_ids.add(msg.id)
        if msg.role not in ROLES:
            raise InvalidMessages(f"unknown role {msg.role!r}", field=f"{where}.role")
        results = msg.tool_results
        if open_calls and not results:
            pending = ", ".join(sorted(open_calls))
            raise InvalidMessages(
                f"tool call(s) {pending} have no result before {where}", field=f"{where}"
            )
        for res in results:
            if res.id in open_calls:
                del open_calls[res.id]
            elif res.id in new_calls or res.id in known_tool_uses:
                raise InvalidMessages(
                    f"tool result {res.id!r} answers a call that already has a result",
                    field=f"{where}.content",
                )
            else:
                raise InvalidMessages(
                    f"orphan tool result {res.id!r}: no tool_use with that id comes before it",
                    field=f"{where}.content",
                )
        for use in msg.tool_uses:
            if use.id in new_calls or use.id in known_tool_uses or use.id in open_calls:
                raise InvalidMessages(f"duplicate tool_use id {use.id!r}", field=f"{where}.content")
            new_calls.add(use.id)
            open_calls[use.id] = index
    if open_calls and not allow_pending_tail:
        pending = ", ".join(sorted(open_calls))
        raise InvalidMessages(f"tool call(s) {pending} have no result", field="messages")
