"""OpenAI's Responses API (``POST /v1/responses``): what Codex, the OpenAI Agents SDK and
``client.responses.create`` speak.

Everything the gateway knows about this protocol is here: the request's shape
(``instructions``, ``input`` as a string or as items, ``tools``,
``previous_response_id``), the answer's (output items, ``usage``), the streamed
events (``response.created`` … ``response.completed``, ``error``), the error
shape, Codex's compaction signatures, and the conversion of a call to the
chat-completions message list that the shared observe core and the engine read.

The conversion is a view for the inference and the engine, never what goes
upstream in observe mode: there the agent's bytes travel unchanged. Items with
no chat-completions equivalent keep their meaning: reasoning items (opaque,
``encrypted_content``) are left out of the message view and travel verbatim;
a ``compaction`` item (the provider's encrypted summary) becomes a user
message marked opaque; an item type this module does not know is kept as its
JSON text, so it is counted and shown rather than lost.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from contextlab.engine.hook import AgentCompaction
from contextlab.gateway.history import common_prefix

ENDPOINT = "responses"
COMPACT_ENDPOINT = "responses.compact"

# Codex's local compaction: a request with no tools whose last user message is
# this checkpoint prompt; the next request carries the answer after this prefix.
CODEX_CHECKPOINT_PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION"
CODEX_SUMMARY_PREFIX = "Another language model started to solve this problem and produced a summary"
# Codex names each request's kind ("turn", "compaction", "prewarm") in a JSON header.
TURN_METADATA_HEADER = "x-codex-turn-metadata"
# Headers naming the agent's conversation, most specific first (Codex sends both).
CONVERSATION_HEADERS = ("thread-id", "session-id")
MAX_KEY_CHARS = 300

# Items the model produced: between two user turns they make one assistant message.
_ASSISTANT_CALLS = ("function_call", "custom_tool_call", "local_shell_call", "mcp_call", "computer_call",
                    "web_search_call", "file_search_call", "image_generation_call", "code_interpreter_call")
_OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output", "computer_call_output")
_KNOWN_ROLES = ("user", "assistant", "system", "developer")


class BadRequest(ValueError):
    """A request this protocol cannot carry; answered with a 400 in OpenAI's error shape."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def error_body(message: str, *, type: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object, which the Responses API shares with chat completions."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_event(message: str, *, code: str, sequence_number: int = 0) -> bytes:
    """The ``error`` event a stream ends with when it cannot go on.

    Both shapes the API has used: ``code``/``message`` at the top, and an
    ``error`` object, which is what the openai SDKs raise on."""
    event = {"type": "error", "code": code, "message": message, "param": None, "sequence_number": sequence_number,
             "error": {"type": "server_error", "code": code, "message": message, "param": None}}
    return b"event: error\ndata: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n"


# -- the request -------------------------------------------------------------------------


def check(body: Mapping[str, Any]) -> None:
    """Refuse what no provider would take, before anything else reads the body."""
    value = body.get("input")
    if value is not None and not isinstance(value, str | list):
        raise BadRequest("input must be a string or a list of input items", param="input")
    if isinstance(value, list):
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                raise BadRequest(f"input[{index}] must be an object (an input item)", param=f"input[{index}]")
    if value is None and not body.get("previous_response_id") and body.get("conversation") is None:
        raise BadRequest("input is required (a string or a list of input items)", param="input")
    for name in ("previous_response_id", "instructions", "model"):
        if body.get(name) is not None and not isinstance(body.get(name), str):
            raise BadRequest(f"{name} must be a string", param=name)
    if body.get("tools") is not None and not isinstance(body.get("tools"), list):
        raise BadRequest("tools must be a list", param="tools")


def items_of(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The request's input as items (a string input is one user message)."""
    value = body.get("input")
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, dict)]
    return []


def item_type(item: Mapping[str, Any]) -> str:
    # An item with a role and no type is a message (the "easy input message" shape).
    kind = item.get("type")
    return str(kind) if kind is not None else ("message" if "role" in item else "")


def turn_metadata(headers: Mapping[str, str]) -> dict[str, Any]:
    raw = headers.get(TURN_METADATA_HEADER) or ""
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def request_kind(headers: Mapping[str, str]) -> str:
    """Codex's own name for the request: "turn", "compaction", "prewarm"; "" from other clients."""
    kind = turn_metadata(headers).get("request_kind")
    return str(kind)[:40] if isinstance(kind, str) else ""


def compaction_kind(body: Mapping[str, Any], headers: Mapping[str, str], *, endpoint: str = ENDPOINT) -> str:
    """"remote" (the provider compacts: ``/responses/compact`` or a ``compaction_trigger`` item),
    "local" (the agent asks the model for its own summary), or "" for an ordinary request."""
    items = items_of(body)
    if endpoint == COMPACT_ENDPOINT or any(item_type(i) == "compaction_trigger" for i in items):
        return "remote"
    if request_kind(headers) == "compaction":
        return "local"
    last_user = next((i for i in reversed(items) if item_type(i) == "message" and i.get("role") == "user"), None)
    if body.get("tools") == [] and last_user is not None and \
            content_text(last_user.get("content")).lstrip().startswith(CODEX_CHECKPOINT_PROMPT):
        return "local"
    return ""


def unknown_types(body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The input items of a type this adapter does not read, each (type, where): they go upstream
    verbatim and the engine keeps them as their JSON, unread."""
    found = []
    for index, item in enumerate(items_of(body)):
        kind = item_type(item)
        known = (kind == "message" and item.get("role") in _KNOWN_ROLES) or kind in _ASSISTANT_CALLS \
            or kind in _OUTPUTS or kind in ("reasoning", "compaction", "compaction_trigger")
        if not known:
            found.append((kind or "untyped", f"input[{index}]"))
    return found


def previous_response(body: Mapping[str, Any]) -> str:
    """The response the request continues (``previous_response_id``), or ""."""
    value = body.get("previous_response_id")
    return value if isinstance(value, str) else ""


def agent_compaction(body: Mapping[str, Any]) -> AgentCompaction | None:
    """What Codex's compaction left in the request, or None: a ``compaction`` item (remote: the
    provider's encrypted summary) or the summary message its local compaction adds.

    Every request after a compaction still carries it; the gateway only looks
    when the request no longer continues the session's history."""
    items = items_of(body)
    for item in items:
        if item_type(item) == "compaction":
            return AgentCompaction(agent="Codex", kind="remote compaction", summary=opaque_summary_text(item),
                                   opaque=True)
    for item in items:
        if item_type(item) == "message" and item.get("role") == "user":
            text = content_text(item.get("content"))
            if text.lstrip().startswith(CODEX_SUMMARY_PREFIX):
                return AgentCompaction(agent="Codex", kind="local compaction", summary=text)
    return None


def conversation_key(headers: Mapping[str, str], body: Mapping[str, Any]) -> str:
    """What the agent itself calls the conversation (Codex's thread, its prompt cache key); "" when nothing."""
    for name in CONVERSATION_HEADERS:
        value = (headers.get(name) or "").strip()
        if value and value.isprintable():
            return f"{name}:{value}"[:MAX_KEY_CHARS]
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key.strip() and key.isprintable():
        return f"prompt_cache_key:{key.strip()}"[:MAX_KEY_CHARS]
    return ""


# Codex's harness puts its context in user messages of their own, before the user's words.
_HARNESS_OPENINGS = ("<environment_context>", "<user_instructions>", "# AGENTS.md instructions", "<skills_instructions>")


def opening_request(items: Iterable[Mapping[str, Any]]) -> str:
    """The user's first words: the first user message that is not the agent harness's context."""
    for item in items:
        if item_type(item) == "message" and item.get("role") == "user":
            text = content_text(item.get("content")).strip()
            if text and not text.startswith(_HARNESS_OPENINGS):
                return text
    return ""


# -- items as chat messages ---------------------------------------------------------------


def content_text(content: Any) -> str:
    """The text of a message's content: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text") or part.get("refusal") or "") for part in content
                       if isinstance(part, dict))
    return ""


def _parts(content: Any) -> str | list[dict[str, Any]]:
    """Message content as chat content: a string, or text and image parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text"):
            parts.append({"type": "text", "text": str(part.get("text") or "")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": str(part.get("refusal") or "")})
        elif kind == "input_image":
            url = part.get("image_url") or part.get("file_id") or ""
            parts.append({"type": "image_url", "image_url": {"url": str(url)}})
        else:
            # A file or a part type added later: named, so it is counted, never silently dropped.
            name = part.get("filename") or part.get("file_id") or ""
            parts.append({"type": "text", "text": f"[{kind} {name}]".replace(" ]", "]")})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return content_text(output)
    if isinstance(output, dict):
        return json.dumps(output, ensure_ascii=False)
    return "" if output is None else str(output)


def _tool_call(item: Mapping[str, Any]) -> dict[str, Any]:
    """A model's call item as a chat tool call (id = the item's ``call_id``)."""
    kind = item_type(item)
    call_id = str(item.get("call_id") or item.get("id") or "")
    if kind == "function_call":
        name, arguments = str(item.get("name") or ""), item.get("arguments")
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    elif kind == "custom_tool_call":
        name, arguments = str(item.get("name") or ""), str(item.get("input") or "")
    else:
        name = "local_shell" if kind == "local_shell_call" else str(item.get("name") or kind)
        detail = {k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status", "name")}
        arguments = json.dumps(detail, ensure_ascii=False, sort_keys=True)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def opaque_summary_text(item: Mapping[str, Any]) -> str:
    """A ``compaction`` item as the text the message view shows: what it is, never its secret."""
    secret = str(item.get("encrypted_content") or "")
    digest = hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return (f"[compaction summary, encrypted by the provider: opaque to ContextLab; "
            f"{len(secret)} characters, sha256 {digest}]")


@dataclass
class Sourced:
    """One chat message of the view and the items it was made of (verbatim)."""

    message: dict[str, Any]
    items: list[dict[str, Any]]


@dataclass
class _Assistant:
    """The assistant message being gathered from consecutive model items."""

    texts: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    items: list[dict[str, Any]] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.texts) or None}
        if self.calls:
            message["tool_calls"] = self.calls
        return message


def sourced_messages(items: Iterable[dict[str, Any]]) -> tuple[list[Sourced], list[dict[str, Any]]]:
    """Items as chat messages, in order, each with the items it came from; and the trailing
    reasoning items no message followed.

    The model's consecutive items (assistant text, its calls, and the reasoning
    before them, which is opaque and has no chat equivalent) make one
    assistant message, as a chat completion's choice does, so a recorded reply
    and the same items sent back agree.
    """
    out: list[Sourced] = []
    assistant: _Assistant | None = None
    reasoning: list[dict[str, Any]] = []

    def flush() -> None:
        nonlocal assistant
        if assistant is not None and (assistant.texts or assistant.calls):
            out.append(Sourced(assistant.message(), assistant.items))
        elif assistant is not None:
            reasoning.extend(assistant.items)
        assistant = None

    def add(message: dict[str, Any], item: dict[str, Any]) -> None:
        nonlocal reasoning
        flush()
        out.append(Sourced(message, [*reasoning, item]))
        reasoning = []

    for item in items:
        kind = item_type(item)
        role = item.get("role")
        if kind == "message" and role == "assistant" or kind in _ASSISTANT_CALLS or kind == "reasoning":
            if assistant is None:
                assistant, reasoning = _Assistant(items=reasoning), []
            assistant.items.append(item)
            if kind == "message":
                assistant.texts.append(content_text(item.get("content")))
            elif kind != "reasoning":
                assistant.calls.append(_tool_call(item))
        elif kind in _OUTPUTS:
            add({"role": "tool", "tool_call_id": str(item.get("call_id") or item.get("id") or ""),
                 "content": _output_text(item.get("output"))}, item)
        elif kind == "message" and role in _KNOWN_ROLES:
            add({"role": str(role), "content": _parts(item.get("content"))}, item)
        elif kind == "compaction":
            add({"role": "user", "content": opaque_summary_text(item)}, item)
        else:
            # Unknown (or a trigger with no content): kept verbatim as its JSON.
            add({"role": "developer", "content": f"[{kind or 'unknown'} item] "
                                                 + json.dumps(item, ensure_ascii=False, sort_keys=True)}, item)
    flush()
    return out, reasoning


class SourcedPrefixes:
    """The messages a conversation's items made last time, to read only the items that are new.

    Codex resends its whole conversation on every call; reading it all again
    would cost a pass over every item, growing with the conversation (about
    2 ms at 1,000 items). Kept per conversation (bounded, least recently used
    first out): the last call's items and the messages they made. A message
    made of items that the new call repeats, at the same positions, is made
    the same way, provided the item that ended it is repeated too: until then
    the model's run of items (reasoning, text, calls) it belongs to may go on.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._known: OrderedDict[Hashable, tuple[list[dict[str, Any]], list[Sourced]]] = OrderedDict()

    def read(self, conversation: Hashable | None,
             items: list[dict[str, Any]]) -> tuple[list[Sourced], list[dict[str, Any]]]:
        if conversation is None:
            return sourced_messages(items)
        with self._lock:
            known_items, known_sourced = self._known.pop(conversation, ([], []))
        same = len(known_items) if len(known_items) <= len(items) and items[:len(known_items)] == known_items \
            else common_prefix(known_items, items)
        kept: list[Sourced] = []
        read_up_to = 0
        for entry in known_sourced:
            end = read_up_to + len(entry.items)
            if end >= same:  # the item after it is new (or changed): it may read differently now
                break
            kept.append(entry)
            read_up_to = end
        rest, trailing = sourced_messages(items[read_up_to:])
        sourced = kept + rest
        with self._lock:
            self._known[conversation] = (list(items), sourced)
            while len(self._known) > self.size:
                self._known.popitem(last=False)
        return sourced, trailing


sourced_prefixes = SourcedPrefixes(size=64)


def chat_messages(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items as chat messages, in order (``sourced_messages`` without the sources)."""
    return [s.message for s in sourced_messages(items)[0]]


def _match_key(message: Mapping[str, Any]) -> tuple[Any, ...]:
    role = message.get("role")
    if role == "tool":
        return ("tool", str(message.get("tool_call_id") or ""))
    calls = message.get("tool_calls")
    if role == "assistant" and isinstance(calls, list) and calls:
        return ("calls", tuple(str(c.get("id") or "") for c in calls if isinstance(c, dict)))
    return (role, content_text(message.get("content")))


def summary_item(text: str) -> dict[str, Any]:
    """A summary the engine wrote, as the user message item it goes upstream as."""
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _with_output(items: list[dict[str, Any]], output: str) -> list[dict[str, Any]]:
    """The tool output item(s) with the engine's shortened output."""
    return [{**item, "output": output} if item_type(item) in _OUTPUTS else item for item in items]


def items_from_messages(messages: list[dict[str, Any]], sourced: list[Sourced],
                        trailing: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The engine's managed messages back as the request's items.

    A message the request carried goes back as the items it came from,
    verbatim (reasoning with its ``encrypted_content``, a call with its
    output); a shortened tool output carries the engine's text; a message
    the request did not carry (the engine's summary) goes in as a user
    message item. What the engine dropped is not sent.
    """
    keys = [_match_key(s.message) for s in sourced]
    out: list[dict[str, Any]] = []
    cursor = 0
    for message in messages:
        key = _match_key(message)
        found = next((i for i in range(cursor, len(sourced)) if keys[i] == key), None)
        if found is None:
            out.append(summary_item(content_text(message.get("content"))))
            continue
        cursor = found + 1
        source = sourced[found]
        text = content_text(message.get("content"))
        if message.get("role") == "tool" and text != content_text(source.message.get("content")):
            out.extend(_with_output(source.items, text))
        else:
            out.extend(source.items)
    return [*out, *trailing]


def system_and_rest(body: Mapping[str, Any], items: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The system layer (``instructions`` and the leading system/developer messages) and the items after it."""
    texts = [body["instructions"]] if isinstance(body.get("instructions"), str) and body["instructions"] else []
    index = 0
    while index < len(items) and item_type(items[index]) == "message" and \
            items[index].get("role") in ("system", "developer"):
        texts.append(content_text(items[index].get("content")))
        index += 1
    return "\n\n".join(texts), items[index:]


def to_chat(body: Mapping[str, Any], *, earlier: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The request as a chat-completions body (``messages`` and ``tools``), for the inference.

    ``earlier``: the messages of the chain ``previous_response_id`` continues
    (the provider holds them; the gateway saw them go by), its reply included.
    """
    items = items_of(body)
    system, rest = system_and_rest(body, items)
    messages = chat_messages(rest)
    if earlier:
        head = earlier[1:] if earlier[0].get("role") == "system" else earlier
        if not system and earlier[0].get("role") == "system":
            system = content_text(earlier[0].get("content"))
        messages = [*head, *messages]
    if system:
        messages = [{"role": "system", "content": system}, *messages]
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages, "stream": body.get("stream") is True}
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        out["tools"] = tools
    return out


@dataclass
class ManageView:
    """A request as the engine manages it, and what it takes to turn the result back into items."""

    chat: dict[str, Any]
    system_items: list[dict[str, Any]]
    sourced: list[Sourced]
    trailing: list[dict[str, Any]]
    has_system: bool

    def body(self, body: Mapping[str, Any], upstream_messages: list[dict[str, Any]], model: Any) -> dict[str, Any]:
        """The request with the engine's messages as its input; every other field as it came."""
        payload = upstream_messages[1:] if self.has_system and upstream_messages else upstream_messages
        items = items_from_messages(payload, self.sourced, self.trailing)
        return {**body, "model": model, "input": [*self.system_items, *items]}


def manage_view(body: Mapping[str, Any], conversation: Hashable | None = None) -> ManageView:
    """The chat-completions body the engine manages: the system layer (``instructions`` and
    the leading system/developer items) as one system message, then one message per turn item.

    ``conversation``: a key naming the conversation, to read only the items it did not
    send last time (``SourcedPrefixes``)."""
    items = items_of(body)
    system, rest = system_and_rest(body, items)
    sourced, trailing = sourced_prefixes.read(conversation, rest)
    messages = [*([{"role": "system", "content": system}] if system else []), *(s.message for s in sourced)]
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "stream": body.get("stream") is True}
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        chat["tools"] = chat_tools(tools)
    return ManageView(chat=chat, system_items=items[:len(items) - len(rest)], sourced=sourced, trailing=trailing,
                      has_system=bool(system))


def chat_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """Tool definitions in chat-completions' shape, for the engine to count as the schema layer.

    A function tool keeps its name, description and parameters; any other tool
    (a namespace, web search, a custom grammar tool) is counted by its whole
    definition, under its name or type."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "function" and isinstance(tool.get("name"), str) and tool["name"]:
            function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        else:
            function = {"name": str(tool.get("name") or tool.get("type") or "tool"),
                        "description": json.dumps(tool, ensure_ascii=False, sort_keys=True)}
        out.append({"type": "function", "function": function})
    return out


def reply_message(answer: Answer) -> dict[str, Any]:
    """The answer as the assistant message the session records."""
    text, calls = answer.reply()
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


REMOTE_COMPACTION_PROMPT = "[remote compaction: the provider summarises this conversation into an encrypted item]"


def compaction_side_call(body: Mapping[str, Any], *, remote: bool = False) -> dict[str, Any]:
    """A compaction request as what it is: the agent's context manager asking for a summary.

    The checkpoint prompt (for a remote compaction, a note saying what it is)
    is its system prompt, the conversation it summarises its user message, so
    the inference takes it for a side call of the conversation it quotes,
    never for a turn of it.
    """
    chat = to_chat(body)
    messages = chat["messages"]
    last_user = None if remote else next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), None)
    prompt = content_text(messages[last_user]["content"]) if last_user is not None else REMOTE_COMPACTION_PROMPT
    quoted = [m for i, m in enumerate(messages) if i != last_user and m.get("role") != "system"]
    transcript = "\n\n".join(f"{m.get('role')}: {content_text(m.get('content'))}" for m in quoted
                             if content_text(m.get("content")))
    chat["messages"] = [{"role": "system", "content": prompt}, {"role": "user", "content": transcript}]
    return chat


# -- the answer --------------------------------------------------------------------------


@dataclass
class Answer:
    """What a finished response says: its id, output items, usage, and why it did not complete."""

    response_id: str = ""
    status: str = ""
    output: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    error: str = ""

    @property
    def complete(self) -> bool:
        return self.status == "completed" and not self.error

    def reply(self) -> tuple[str, list[dict[str, Any]]]:
        """The reply as a chat message's text and tool calls."""
        message = next((m for m in chat_messages(self.output) if m.get("role") == "assistant"), None)
        if message is None:
            # A remote compaction answers with its encrypted summary alone: the reply is that
            # summary as the next request's message view shows it, so the two are linked.
            summaries = self.compaction_items()
            return (opaque_summary_text(summaries[-1]) if summaries else ""), []
        return content_text(message.get("content")), list(message.get("tool_calls") or [])

    def compaction_items(self) -> list[dict[str, Any]]:
        return [item for item in self.output if item_type(item) == "compaction"]


def _answer_of(response: Mapping[str, Any]) -> Answer:
    output = response.get("output")
    usage = response.get("usage")
    error = response.get("error")
    status = str(response.get("status") or "")
    message = ""
    if isinstance(error, dict) and error:
        message = str(error.get("message") or error.get("code") or "the response failed")
    elif status in ("failed", "incomplete", "cancelled"):
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        message = f"the response ended {status}" + (f": {reason}" if reason else "")
    return Answer(response_id=str(response.get("id") or "")[:200], status=status or "completed",
                  output=[i for i in output if isinstance(i, dict)] if isinstance(output, list) else [],
                  usage=usage if isinstance(usage, dict) else None, error=message)


def answer_of(content: bytes) -> Answer | None:
    """A non-streamed 200 answer, read; None when it is not a response object."""
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    if data.get("object") == "response.compaction" or ("output" in data and "status" not in data):
        # /responses/compact answers with its output items and usage, no status.
        data = {**data, "status": "completed"}
    return _answer_of(data)


class StreamReader:
    """Reads the provider's events as they are relayed; knows when the response is over.

    ``finished`` turns true with the terminal event (``response.completed``,
    ``response.failed``, ``response.incomplete``, ``error``): the call can be
    recorded before that event reaches the agent.
    """

    TERMINAL = ("response.completed", "response.failed", "response.incomplete", "response.cancelled")

    def __init__(self) -> None:
        self.finished = False
        self.answer = Answer()
        self._items: dict[int, dict[str, Any]] = {}

    def feed(self, payload: bytes) -> None:
        if payload.strip() == b"[DONE]":
            return
        try:
            event = json.loads(payload)
        except (ValueError, RecursionError):
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            index = event.get("output_index")
            self._items[index if isinstance(index, int) else len(self._items)] = event["item"]
        elif kind in self.TERMINAL and isinstance(event.get("response"), dict):
            self.answer = _answer_of(event["response"])
            if not self.answer.output and self._items:
                # Some providers send the finished items only as they go.
                self.answer.output = [self._items[i] for i in sorted(self._items)]
            self.finished = True
        elif kind == "error":
            error = event.get("error")
            nested: dict[str, Any] = error if isinstance(error, dict) else {}
            self.answer.status = "failed"
            self.answer.error = str(event.get("message") or nested.get("message") or event.get("code")
                                    or nested.get("code") or "the provider sent an error event")
            self.finished = True

    @property
    def complete(self) -> bool:
        return self.finished and self.answer.complete
