"""The Anthropic Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``).

What Claude Code and the anthropic SDKs send and expect, and nothing about
forwarding or recording (the shared core does that):

- requests: top-level ``system`` (a string or text blocks), ``messages`` whose
  content is a string or blocks (``text``, ``image``, ``document``,
  ``tool_use``, ``tool_result``, ``thinking``, ``redacted_thinking``, and
  block types this module has never heard of, kept verbatim);
- the answer: one ``message`` object, or a stream of server-sent events
  (``message_start``, ``content_block_start|delta|stop``, ``message_delta``,
  ``message_stop``, ``ping``, ``error``) that ``StreamBuilder`` adds up;
- errors: ``{"type": "error", "error": {"type": ..., "message": ...}}``;
- Claude Code's own compaction: a request whose last user message carries its
  summarisation instructions, and a continuation that opens with the summary;
- the conversion of a conversation to the chat-completions shape the engine and
  the observe inference read (``to_chat``).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict, defaultdict, deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx2
from django.http import HttpRequest, JsonResponse

from contextlab.engine.hook import AgentCompaction
from contextlab.gateway import history

_T = TypeVar("_T")

ENDPOINT = "anthropic.messages"
DEFAULT_VERSION = "2023-06-01"
SESSION_ID_HEADER = "X-Claude-Code-Session-Id"

# The error ``type`` Anthropic uses for each status; the CLI and the SDKs show the message.
_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
    429: "rate_limit_error", 500: "api_error", 502: "api_error", 503: "overloaded_error",
    504: "api_error", 529: "overloaded_error",
}

# Response headers worth passing back besides the shared ones: Anthropic's request id
# and its rate-limit budgets (``anthropic-ratelimit-*``).
PASSED_PREFIXES = ("anthropic-", "request-id")


def error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def error_response(status: int, message: str) -> JsonResponse:
    """An error the gateway itself raises, shaped as Anthropic shapes its own."""
    return JsonResponse(error_body(status, message), status=status)


def error_event(message: str, status: int = 502) -> bytes:
    """A stream's ``error`` event: the SDKs raise it, so a broken stream never reads as a finished reply."""
    data = json.dumps(error_body(status, message), ensure_ascii=False, separators=(",", ":"))
    return f"event: error\ndata: {data}\n\n".encode()


# -- upstream --------------------------------------------------------------------------------


def upstream_headers(client: Mapping[str, str], *, api_key: str, credential: tuple[str, str] | None,
                     stream: bool, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The headers of the upstream call: ``credential`` (header, value) when the client's own
    credential is forwarded, else the stored key as ``x-api-key``; the client's
    ``anthropic-version`` and ``anthropic-beta`` as they came."""
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if stream else "application/json",
               "anthropic-version": (client.get("anthropic-version") or "").strip() or DEFAULT_VERSION}
    beta = (client.get("anthropic-beta") or "").strip()
    if beta:
        headers["anthropic-beta"] = beta
    if credential is not None:
        headers[credential[0]] = credential[1]
    elif api_key:
        headers["x-api-key"] = api_key
    if extra:
        headers.update({str(k): str(v) for k, v in extra.items()})
    return headers


# -- the answer ------------------------------------------------------------------------------


@dataclass
class Reply:
    """What the inference keeps of one answer: its text, its tool calls (chat shape), its usage."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    return {"id": str(block.get("id") or ""), "type": "function",
            "function": {"name": str(block.get("name") or ""),
                         "arguments": json.dumps(block.get("input") if block.get("input") is not None else {},
                                                 ensure_ascii=False, separators=(",", ":"))}}


def reply_of(message: Any) -> Reply:
    """The reply in a ``message`` object (a non-streamed answer, or a stream added up)."""
    if not isinstance(message, dict):
        return Reply()
    blocks = [b for b in message.get("content") or [] if isinstance(b, dict)]
    usage = message.get("usage")
    edits = message.get("context_management")
    return Reply(text="".join(str(b.get("text") or "") for b in blocks if b.get("type") == "text"),
                 tool_calls=[_tool_call(b) for b in blocks if b.get("type") == "tool_use"],
                 usage=usage if isinstance(usage, dict) else None,
                 context_management=edits if isinstance(edits, dict) else None)


def reply_from_body(content: bytes) -> Reply:
    try:
        return reply_of(json.loads(content))
    except (ValueError, RecursionError):
        return Reply()


@dataclass
class StreamBuilder:
    """Adds up a stream's events into the ``message`` a non-streamed call would have answered."""

    message: dict[str, Any] = field(default_factory=dict)
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    partial_json: dict[int, list[str]] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = None
    complete: bool = False
    error: str = ""
    events: int = 0

    def add(self, event: Any) -> None:
        if not isinstance(event, dict):
            return
        self.events += 1
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self.message = dict(event["message"])
            if isinstance(self.message.get("usage"), dict):
                self.usage.update(self.message["usage"])
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            self.blocks[_index(event)] = dict(event["content_block"])
        elif kind == "content_block_delta" and isinstance(event.get("delta"), dict):
            self._delta(_index(event), event["delta"])
        elif kind == "content_block_stop":
            self._close(_index(event))
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason"):
                self.stop_reason = str(delta["stop_reason"])
            if isinstance(event.get("usage"), dict):
                # The final counts; input counts may come here too (server-side tools).
                self.usage.update({k: v for k, v in event["usage"].items() if v is not None})
            if isinstance(event.get("context_management"), dict):
                self.message["context_management"] = event["context_management"]
        elif kind == "message_stop":
            self.complete = True
        elif kind == "error":
            error = event.get("error")
            self.error = str(error.get("message") if isinstance(error, dict) else error or "error event")

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self.blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = str(block.get("text") or "") + str(delta.get("text") or "")
        elif kind == "input_json_delta":
            self.partial_json.setdefault(index, []).append(str(delta.get("partial_json") or ""))
        elif kind == "thinking_delta":
            block["thinking"] = str(block.get("thinking") or "") + str(delta.get("thinking") or "")
        elif kind == "signature_delta":
            block["signature"] = str(block.get("signature") or "") + str(delta.get("signature") or "")
        elif kind == "citations_delta" and isinstance(delta.get("citation"), dict):
            block.setdefault("citations", []).append(delta["citation"])

    def _close(self, index: int) -> None:
        parts = self.partial_json.pop(index, None)
        if parts is not None and index in self.blocks:
            raw = "".join(parts)
            try:
                self.blocks[index]["input"] = json.loads(raw) if raw.strip() else {}
            except ValueError:
                self.blocks[index]["input"] = {"_unparsed": raw}

    @property
    def finished(self) -> bool:
        return self.complete or bool(self.error)

    def result(self) -> dict[str, Any]:
        message = dict(self.message)
        message["content"] = [block for _, block in sorted(self.blocks.items())]
        message["stop_reason"] = self.stop_reason
        message["usage"] = dict(self.usage)
        return message


def _index(event: dict[str, Any]) -> int:
    index = event.get("index")
    return index if isinstance(index, int) else 0


def stream_events(payloads: list[bytes], builder: StreamBuilder) -> None:
    """Feed ``data:`` payloads of a stream to the builder (one JSON object each)."""
    for payload in payloads:
        try:
            builder.add(json.loads(payload))
        except (ValueError, RecursionError):
            continue


# -- the conversation in the internal shape --------------------------------------------------


def _text_of_blocks(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text") or "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


# Claude Code opens its system blocks with an attribution line whose hash changes from one
# request to the next; as part of the system prompt it would read as a new prompt every call.
_BILLING_LINE = "x-anthropic-billing-header:"


def system_text(system: Any) -> str:
    """The top-level ``system`` as one string (a string, or text blocks), Claude Code's attribution line left out."""
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n".join(str(b.get("text") or "") for b in system if isinstance(b, dict) and b.get("type") == "text"
                         and not str(b.get("text") or "").startswith(_BILLING_LINE))
    return ""


def _tool_result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text") or ""))
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type') or 'block'}]")
        return "\n".join(parts)
    return ""


def unknown_text(block: dict[str, Any]) -> str:
    """A block this adapter does not read, as the engine sees it: marked unknown, its JSON whole."""
    return f"[unknown {block.get('type') or 'block'}] " + json.dumps(block, ensure_ascii=False, sort_keys=True)


def _media_part(block: dict[str, Any]) -> dict[str, Any]:
    """An ``image`` or ``document`` block as the chat content part the engine reads (the rest as
    an unknown text part): the engine counts it and keeps it whole."""
    kind = block.get("type")
    given = block.get("source")
    source: dict[str, Any] = given if isinstance(given, dict) else {}
    origin, media_type, data = source.get("type"), source.get("media_type"), source.get("data")
    if kind == "image" and origin == "base64" and isinstance(data, str) and isinstance(media_type, str):
        return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{data}"}}
    if kind == "image" and origin == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    if kind == "document" and origin == "base64" and isinstance(data, str) and isinstance(media_type, str):
        return {"type": "file", "file": {"file_data": f"data:{media_type};base64,{data}",
                                         "filename": str(block.get("title") or "document")}}
    if kind == "document" and origin == "text" and isinstance(data, str):
        return {"type": "text", "text": data}
    if kind == "document" and origin == "content" and isinstance(source.get("content"), list | str):
        return {"type": "text", "text": _text_of_blocks(source["content"])}
    if kind in ("image", "document") and origin in ("url", "file"):
        reference = source.get("url") if origin == "url" else source.get("file_id")
        if isinstance(reference, str):
            return {"type": "file", "file": {"file_id": reference}}
    return {"type": "text", "text": unknown_text(block)}


def _user_to_chat(content: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_result":
            message: dict[str, Any] = {"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""),
                                       "content": _tool_result_text(block)}
            if block.get("is_error") is True:
                message["is_error"] = True
            out.append(message)
        elif block.get("type") == "text":
            parts.append({"type": "text", "text": str(block.get("text") or "")})
        else:
            # The engine reads an image or a document as media (counted, never cut) and any other
            # block as its JSON marked unknown; what goes upstream is the block as it came (``from_chat``).
            parts.append(_media_part(block))
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _assistant_to_chat(content: list[Any], *, thinking_text: bool = True) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thinking: list[str] = []
    others: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "tool_use":
            calls.append(_tool_call(block))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking") or ""))
        elif kind != "redacted_thinking":
            others.append(_media_part(block))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if others:
        message["content"] = [*([{"type": "text", "text": "".join(texts)}] if texts else []), *others]
    if calls:
        message["tool_calls"] = calls
    if thinking and thinking_text:
        message["reasoning_content"] = "\n".join(thinking)
    return message


def messages_to_chat(messages: Any, *, thinking_text: bool = True) -> list[dict[str, Any]]:
    """Anthropic messages as chat messages: each ``tool_result`` block becomes a ``tool`` message
    right after the assistant message that called it; roles are kept as sent (Claude Code sends
    mid-conversation ``system`` messages, some empty: no alternation is assumed)."""
    out: list[dict[str, Any]] = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role") or "")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif not isinstance(content, list):
            out.append({"role": role, "content": ""})
        elif role == "assistant":
            out.append(_assistant_to_chat(content, thinking_text=thinking_text))
        elif role == "user":
            out.extend(_user_to_chat(content))
        else:
            out.append({"role": role, "content": _text_of_blocks(content)})
    return out


class ConvertedPrefixes:
    """The chat conversion of the messages a conversation sent last time, to convert only what is new.

    An agent resends its whole conversation on every call; converting it all would cost
    a pass over every block, growing with the conversation. Kept per conversation
    (bounded, least recently used first out): the last call's messages and the chat
    messages each became. A message equal to the one at the same position last time
    converts the same way.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._known: OrderedDict[Hashable, tuple[list[Any], list[list[dict[str, Any]]], bool]] = OrderedDict()

    def convert(self, conversation: Hashable | None, messages: Any, *, thinking_text: bool) -> list[dict[str, Any]]:
        if conversation is None or not isinstance(messages, list):
            return messages_to_chat(messages, thinking_text=thinking_text)
        with self._lock:
            known, pieces, known_thinking = self._known.pop(conversation, ([], [], thinking_text))
        if known_thinking != thinking_text:
            known, pieces = [], []
        same = len(known) if len(known) <= len(messages) and messages[:len(known)] == known else \
            history.common_prefix(known, messages)
        pieces = pieces[:same] + [messages_to_chat([m], thinking_text=thinking_text) for m in messages[same:]]
        with self._lock:
            self._known[conversation] = (list(messages), pieces, thinking_text)
            while len(self._known) > self.size:
                self._known.popitem(last=False)
        return [chat for piece in pieces for chat in piece]


converted = ConvertedPrefixes(size=64)


def tools_to_chat(tools: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        if "input_schema" in tool or tool.get("type") in (None, "custom"):
            out.append({"type": "function", "function": {
                "name": str(tool.get("name") or ""), "description": str(tool.get("description") or ""),
                "parameters": tool.get("input_schema") or {}}})
        else:
            # A server tool (web search, code execution, ...): counted as it came.
            out.append(tool)
    return out


def to_chat(body: Any, *, thinking_text: bool = True, conversation: Hashable | None = None) -> dict[str, Any]:
    """The request in the chat-completions shape the observe inference and the engine read.

    ``thinking_text=False`` (manage mode) leaves thinking out of the engine's copy: it goes
    upstream verbatim with its signature from the client's own blocks (``from_chat``), and is
    never fed to a summary. ``conversation``: a key naming the conversation, to convert only
    the messages it did not send last time (``ConvertedPrefixes``)."""
    if not isinstance(body, dict):
        return {"messages": []}
    messages = converted.convert(conversation, body.get("messages"), thinking_text=thinking_text)
    system = system_text(body.get("system"))
    if system:
        messages.insert(0, {"role": "system", "content": system})
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "stream": body.get("stream") is True}
    tools = tools_to_chat(body.get("tools"))
    if tools:
        chat["tools"] = tools
    if isinstance(body.get("max_tokens"), int):
        chat["max_tokens"] = body["max_tokens"]
    edits = context_edits(body)
    if edits:
        chat["context_management"] = {"edits": edits}
    return chat


def with_applied_edits(chat: dict[str, Any], applied: Any) -> dict[str, Any]:
    """The chat-shaped request with the edits the provider said it applied (the answer's
    ``context_management``), for the turn's decision flow."""
    edits = applied.get("applied_edits") if isinstance(applied, dict) else None
    if not isinstance(edits, list):
        return chat
    management = dict(chat.get("context_management") or {})
    management["applied_edits"] = [e for e in edits if isinstance(e, dict)]
    return {**chat, "context_management": management}


def reply_to_chat(message: Any) -> dict[str, Any]:
    """An answer's ``message`` as the chat assistant message the session records."""
    content = message.get("content") if isinstance(message, dict) else None
    return _assistant_to_chat(content if isinstance(content, list) else [], thinking_text=False)


# -- back from the engine's payload ----------------------------------------------------------


def _key(message: dict[str, Any]) -> tuple[str, ...]:
    """What identifies a chat message between the request and the engine's payload, cheaply: an
    assistant message calling tools by its call ids (as the gateway's history digests do), any
    other by role and text. No hashing: it runs over the whole conversation on every call."""
    role = str(message.get("role") or "")
    calls = message.get("tool_calls")
    if role == "assistant" and calls:
        return ("calls", *(str(c.get("id") or "") for c in calls if isinstance(c, dict)))
    return (role, history.content_text(message.get("content")))


def from_chat(payload: list[dict[str, Any]], original: Any) -> list[dict[str, Any]]:
    """The engine's managed messages (chat shape) as Anthropic messages.

    Every message the engine kept as it came is the client's own message, block for
    block (thinking with its signature, ``cache_control``, unknown block types); a tool
    result the engine shortened keeps its block with the shorter content; a message the
    client never sent (the engine's summary) becomes a user text message. Tool results
    go back into the user message after the assistant message that called them, first.
    """
    # Equal keys (the same short answer twice) are matched in order: each kept
    # message gets its own blocks back, thinking signatures included.
    assistants: dict[tuple[str, ...], deque[dict[str, Any]]] = defaultdict(deque)
    users: dict[tuple[str, ...], deque[list[Any]]] = defaultdict(deque)
    others: dict[tuple[str, ...], deque[dict[str, Any]]] = defaultdict(deque)
    results: dict[str, dict[str, Any]] = {}
    for message in original if isinstance(original, list) else []:
        if not isinstance(message, dict):
            continue
        role, content = message.get("role"), message.get("content")
        if role == "assistant" and isinstance(content, list):
            ids = [str(b.get("id") or "") for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
            key = ("calls", *ids) if ids else _key(_assistant_to_chat(content, thinking_text=False))
            assistants[key].append(message)
        elif role == "user" and isinstance(content, list):
            rest = []
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    results.setdefault(str(block.get("tool_use_id") or ""), block)
                else:
                    rest.append(block)
            if rest:
                for chat in _user_to_chat(rest):
                    users[_key(chat)].append(rest)
        else:
            for chat in messages_to_chat([message], thinking_text=False):
                (assistants if role == "assistant" else others)[_key(chat)].append(message)
    out: list[dict[str, Any]] = []

    def user_blocks(blocks: list[Any]) -> None:
        last = out[-1] if out else None
        if last is not None and last.get("role") == "user" and isinstance(last.get("content"), list):
            last["content"].extend(blocks)
        else:
            out.append({"role": "user", "content": list(blocks)})

    for chat in payload:
        role = chat.get("role")
        if role == "assistant":
            found = _take(assistants, _key(chat))
            out.append(dict(found) if found is not None else _assistant_from_chat(chat))
        elif role == "tool":
            call_id = str(chat.get("tool_call_id") or "")
            block = dict(results.get(call_id) or {"type": "tool_result", "tool_use_id": call_id})
            text = chat.get("content") if isinstance(chat.get("content"), str) else _text_of_blocks(chat.get("content"))
            if "content" not in block or _tool_result_text(block) != text:
                block["content"] = text  # shortened by the engine (or never seen): the engine's text
            # A result follows its call: never merged into a user message that has text already.
            last = out[-1] if out else None
            if last is not None and last.get("role") == "user" and isinstance(last.get("content"), list) and all(
                    isinstance(b, dict) and b.get("type") == "tool_result" for b in last["content"]):
                last["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif role == "user":
            blocks = _take(users, _key(chat))
            same = _take(others, _key(chat)) if blocks is None else None
            if same is not None:
                out.append(dict(same))  # a user message with string content, as it came
                continue
            if blocks is None:
                content = chat.get("content")
                blocks = [{"type": "text", "text": content if isinstance(content, str) else _text_of_blocks(content)}]
            user_blocks(blocks)
        else:
            found = _take(others, _key(chat))
            out.append(dict(found) if found is not None else {"role": role, "content": chat.get("content") or ""})
    return out


def _take(found: dict[tuple[str, ...], deque[_T]], key: tuple[str, ...]) -> _T | None:
    queue = found.get(key)
    return queue.popleft() if queue else None


def _assistant_from_chat(chat: dict[str, Any]) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []
    content = chat.get("content")
    text = content if isinstance(content, str) else _text_of_blocks(content)
    if text:
        blocks.append({"type": "text", "text": text})
    for call in chat.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        blocks.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": arguments})
    return {"role": "assistant", "content": blocks or [{"type": "text", "text": ""}]}


# -- validation ------------------------------------------------------------------------------


def invalid(body: dict[str, Any]) -> str:
    """Why the body is no Messages request (a message for the 400), or "" when it is one."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: a model name (a string) is required"
    messages = body.get("messages")
    if not isinstance(messages, list):
        return "messages: a list of messages is required"
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"messages.{index}: a message must be an object"
        if not isinstance(message.get("role"), str):
            return f"messages.{index}.role: a string is required"
        content = message.get("content")
        if not isinstance(content, str | list):
            return f"messages.{index}.content: a string or a list of content blocks is required"
        if isinstance(content, list):
            for position, block in enumerate(content):
                if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                    return f"messages.{index}.content.{position}: a content block needs a string type"
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        return "system: a string or a list of text blocks is required"
    return ""


# -- the agent's own compaction and context editing ------------------------------------------

# Claude Code's compaction prompt (the last user message of its summarising call) and the opening
# of the user message it continues from. Matched loosely: the wording moves between versions.
_COMPACT_REQUEST = re.compile(r"create a detailed summary of the conversation|<summary>\s*block|"
                              r"an <analysis> block followed by a <summary> block", re.IGNORECASE)
_COMPACT_CONTINUATION = re.compile(r"This session is being continued from a previous conversation|"
                                   r"summary below covers the earlier portion of the conversation", re.IGNORECASE)


def _last_user_text(messages: Any) -> str:
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of_blocks(message.get("content"))
    return ""


def is_compaction_request(body: Any) -> bool:
    """Claude Code asking the model to summarise the conversation (``/compact``, auto-compaction)."""
    return isinstance(body, dict) and bool(_COMPACT_REQUEST.search(_last_user_text(body.get("messages"))[-20000:]))


def compaction_summary(body: Any) -> str:
    """The summary a post-compaction request opens with, or "" when it opens with none."""
    messages = body.get("messages") if isinstance(body, dict) else None
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict) and message.get("role") == "user":
            text = _text_of_blocks(message.get("content"))
            return text if _COMPACT_CONTINUATION.search(text[:2000]) else ""
    return ""


def agent_compaction(body: Any) -> AgentCompaction | None:
    """Claude Code's compaction as the request after it shows it (its summary opens the
    conversation), or None."""
    summary = compaction_summary(body)
    return AgentCompaction(agent="Claude Code", kind="its summary", summary=summary) if summary else None


# The content block types this adapter reads (the rest go upstream as they came, unread).
KNOWN_BLOCKS = frozenset({"text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking"})


def unknown_types(body: Any) -> list[tuple[str, str]]:
    """The content blocks of a type this adapter does not read, each (type, where)."""
    found = []
    messages = body.get("messages") if isinstance(body, dict) else None
    for index, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        for position, block in enumerate(content if isinstance(content, list) else []):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in KNOWN_BLOCKS:
                found.append((str(kind or "untyped")[:100], f"messages[{index}].content[{position}]"))
    return found


COUNT_ENDPOINT = "anthropic.count_tokens"


def counted_tokens(content: bytes) -> int | None:
    """The input tokens a ``count_tokens`` answer reports (``{"input_tokens": N}``), or None."""
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return None
    value = data.get("input_tokens") if isinstance(data, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def context_edits(body: Any) -> list[dict[str, Any]]:
    """The server-side context edits the request asks for (``context_management.edits``)."""
    management = body.get("context_management") if isinstance(body, dict) else None
    edits = management.get("edits") if isinstance(management, dict) else None
    return [e for e in edits if isinstance(e, dict)] if isinstance(edits, list) else []


# -- the wire, for the shared forwarding core (``contextlab.gateway.observe.Wire``) -----------


class _Watcher:
    """Reads a relayed stream on the side (``observe.Watcher``)."""

    def __init__(self) -> None:
        self.builder = StreamBuilder()

    def feed(self, payload: bytes) -> bool:
        try:
            self.builder.add(json.loads(payload))
        except (ValueError, RecursionError):
            return False
        return self.builder.finished

    def store(self, call: Any, error: str) -> None:
        builder = self.builder
        call.error = error or (f"the upstream sent an error event: {builder.error}" if builder.error else "") or (
            "" if builder.complete else "the stream ended before message_stop")
        if builder.complete and not call.error:
            _store(call, reply_of(builder.result()))

    @property
    def broken(self) -> bool:
        # An upstream error event already tells the client; a stream that just stops does not.
        return not self.builder.finished

    def note(self, span: Any) -> None:
        # Imported here: the adapter stays free of the telemetry set-up until a span exists.
        from contextlab.support import telemetry

        model = str((self.builder.message or {}).get("model") or "")
        reasons = [self.builder.stop_reason] if self.builder.stop_reason else []
        telemetry.note_answer(span, model=model, finish_reasons=reasons)


def _store(call: Any, reply: Reply) -> None:
    call.reply_text = reply.text
    call.reply_tool_calls = reply.tool_calls
    call.usage = reply.usage
    call.provider_edits = reply.context_management


class Wire:
    """The Messages API for observe mode's forwarding core."""

    endpoint = ENDPOINT  # ObservedCall.endpoint

    def __init__(self, path: str = "messages") -> None:
        self.path = path

    def url(self, provider: Any, request: HttpRequest) -> str:
        query = request.META.get("QUERY_STRING", "")
        return str(provider.url(self.path)) + (f"?{query}" if query else "")

    def headers(self, provider: Any, api_key: str, credential: Any, request: HttpRequest, *,
                stream: bool) -> dict[str, str]:
        extra = provider.extra_headers if isinstance(provider.extra_headers, dict) else None
        return upstream_headers(request.headers, api_key=api_key, stream=stream, extra=extra,
                                credential=(credential.header, credential.value) if credential is not None else None)

    def error(self, status: int, message: str, code: str) -> JsonResponse:
        return error_response(status, message)

    def store_reply(self, call: Any, content: bytes) -> None:
        _store(call, reply_from_body(content))

    def watcher(self) -> _Watcher:
        return _Watcher()

    def broken_tail(self, message: str) -> bytes:
        return error_event(message)

    def passed(self, answer: httpx2.Response) -> dict[str, str]:
        return {name: value for name, value in answer.headers.items()
                if name.lower().startswith(PASSED_PREFIXES) or name.lower() in (
                    "content-type", "retry-after", "x-should-retry")}


MESSAGES = Wire("messages")
COUNT_TOKENS = Wire("messages/count_tokens")


# -- context edits applied by ContextLab (for an upstream that cannot) ------------------------

CLEARED_TOOL_RESULT = "[tool result cleared by ContextLab (clear_tool_uses)]"
_DEFAULT_TRIGGER = 100_000
_DEFAULT_KEEP_TOOL_USES = 3


@dataclass
class AppliedEdits:
    """What ContextLab's own run of the request's context edits did."""

    messages: list[dict[str, Any]]
    # Anthropic's shape, for the answer's ``context_management.applied_edits``.
    applied: list[dict[str, Any]] = field(default_factory=list)
    # ContextLab's trace of exactly what each edit removed.
    removed: list[dict[str, Any]] = field(default_factory=list)


def _value(spec: Any, default: int) -> int:
    value = spec.get("value") if isinstance(spec, dict) else None
    return value if isinstance(value, int) and value >= 0 else default


def apply_context_edits(messages: list[dict[str, Any]], edits: list[dict[str, Any]], *, input_tokens: int,
                        count: Any) -> AppliedEdits:
    """Run ``clear_tool_uses_*`` and ``clear_thinking_*`` on the messages as Anthropic's server would.

    ``input_tokens``: the request's size as ContextLab counted it (the triggers' measure);
    ``count``: text → tokens, for what each edit cleared. Edits of other types are left out
    (named in ``removed`` as not applied)."""
    result = AppliedEdits(messages=[dict(m) for m in messages])
    for edit in edits:
        kind = str(edit.get("type") or "")
        if kind.startswith("clear_tool_uses_"):
            _clear_tool_uses(result, edit, input_tokens=input_tokens, count=count)
        elif kind.startswith("clear_thinking_"):
            _clear_thinking(result, edit, count=count)
        else:
            result.removed.append({"edit": kind, "not_applied": "ContextLab does not run this edit"})
    return result


def _clear_tool_uses(result: AppliedEdits, edit: dict[str, Any], *, input_tokens: int, count: Any) -> None:
    kind = str(edit["type"])
    if input_tokens < _value(edit.get("trigger"), _DEFAULT_TRIGGER):
        return
    keep = _value(edit.get("keep"), _DEFAULT_KEEP_TOOL_USES)
    excluded = set(edit.get("exclude_tools") or []) if isinstance(edit.get("exclude_tools"), list) else set()
    clear_inputs = edit.get("clear_tool_inputs") is True
    uses = [(index, block) for index, message in enumerate(result.messages) if message.get("role") == "assistant"
            and isinstance(message.get("content"), list) for block in message["content"]
            if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") not in excluded]
    cleared = uses[:max(0, len(uses) - keep)]
    if not cleared:
        return
    ids = {str(block.get("id")): str(block.get("name") or "") for _, block in cleared}
    tokens = 0
    for index, message in enumerate(result.messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        changed = False
        blocks = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result" and str(block.get("tool_use_id")) in ids \
                    and _tool_result_text(block) != CLEARED_TOOL_RESULT:
                before = count(_tool_result_text(block))
                tokens += before
                result.removed.append({"edit": kind, "tool_use_id": block.get("tool_use_id"),
                                       "tool": ids[str(block.get("tool_use_id"))], "tokens": before})
                block = {**block, "content": CLEARED_TOOL_RESULT}
                changed = True
            elif clear_inputs and isinstance(block, dict) and block.get("type") == "tool_use" and \
                    str(block.get("id")) in ids and block.get("input"):
                tokens += count(json.dumps(block.get("input"), ensure_ascii=False))
                block = {**block, "input": {}}
                changed = True
            blocks.append(block)
        if changed:
            result.messages[index] = {**message, "content": blocks}
    result.applied.append({"type": kind, "cleared_tool_uses": len(cleared), "cleared_input_tokens": tokens})


def _clear_thinking(result: AppliedEdits, edit: dict[str, Any], *, count: Any) -> None:
    kind = str(edit["type"])
    keep_spec = edit.get("keep")
    if keep_spec == "all":
        return
    keep = _value(keep_spec, 1)
    thinking_turns = [index for index, message in enumerate(result.messages) if message.get("role") == "assistant"
                      and isinstance(message.get("content"), list) and any(
                          isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")
                          for b in message["content"])]
    cleared = thinking_turns[:max(0, len(thinking_turns) - keep)]
    if not cleared:
        return
    tokens = 0
    for index in cleared:
        message = result.messages[index]
        kept = []
        for block in message["content"]:
            if isinstance(block, dict) and block.get("type") in ("thinking", "redacted_thinking"):
                size = count(str(block.get("thinking") or ""))
                tokens += size
                result.removed.append({"edit": kind, "message": index, "block": block.get("type"), "tokens": size})
            else:
                kept.append(block)
        result.messages[index] = {**message, "content": kept}
    result.applied.append({"type": kind, "cleared_thinking_turns": len(cleared), "cleared_input_tokens": tokens})


def with_context_management(message: dict[str, Any], applied: list[dict[str, Any]]) -> dict[str, Any]:
    """An answer's ``message`` with the edits ContextLab applied, as Anthropic reports its own."""
    return {**message, "context_management": {"applied_edits": applied}}
