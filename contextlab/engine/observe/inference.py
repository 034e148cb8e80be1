"""Infer what an agent's own context manager did, from the requests it sends.

An agent that manages its own context (CoPaw, Claude Code, OpenHands, ...)
sends the LLM a full message list on every call. Comparing one request of a
conversation with the next shows what its context manager did in between:
messages dropped, tool outputs shortened, a summary inserted or replaced, a
turn split, the system prompt or the tool schemas changed. Nothing here reads
an agent-specific label; the inference works from the message lists alone.

Conversation identity survives the agent's own compactions (the first user
message is gone after one): a request continues a conversation when the client
names the session, or when it keeps part of the conversation's last messages,
or when its leading message holds the reply of one of the conversation's own
side calls (the compactor's summary).

Side calls are the agent's context manager calling the LLM for itself (a
compactor, a memory summariser): a request whose system prompt is not the
conversation's and whose text quotes the conversation. They belong to the
conversation they quote, never start a new one; requests that continue a side
call (same system prompt and first user message) join the same thread.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from contextlab.engine.convert.openai import from_openai
from contextlab.engine.core.errors import ContextLabError
from contextlab.engine.core.tokens import TokenCounter
from contextlab.engine.core.trace import SCHEMA, flaw
from contextlab.engine.observe.provider_edits import provider_edits_step

# Notices agents append when they cut a tool output. Recognised to tell a
# shortened output with a notice from a silent cut; the cut itself is found by
# comparing the two versions, whatever the notice says.
_NOTICE = re.compile(r"<<<TRUNCATED>>>|\[(?:output )?truncated|output (?:above )?(?:was|has been) truncated",
                     re.IGNORECASE)
_PATH = re.compile(r"file_path=\{?([^\s}'\"]+)|((?:/[\w.\-]+)+/[\w.\-]+\.\w+)")
_SPACE = re.compile(r"\s+")
# A side call is recognised by quoting at least one conversation message's
# opening characters; shorter texts ("ok", "Turn 3") would match by chance.
QUOTE_CHARS = 60
MIN_QUOTE_CHARS = 24


def text_of(content: Any) -> str:
    """The text of an OpenAI message content (a string or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content
                       if isinstance(part, dict) and part.get("type") in ("text", "input_text", None))
    return str(content)


def byte_size(text: str) -> int:
    return len(text.encode("utf-8"))


def _squash(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def _digest(text: str) -> str:
    # "surrogatepass": a lone surrogate that reached the inference still gets a key, not an error.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def message_keys(messages: list[dict[str, Any]]) -> list[str]:
    """A stable identity for each message that survives truncation of tool outputs.

    Tool results are known by their call id, assistant calls by their call ids,
    other messages by role and text (the n-th equal text gets ``#n``).
    """
    keys: list[str] = []
    seen: dict[str, int] = {}
    for message in messages:
        role = str(message.get("role", ""))
        if role == "tool":
            key = f"tool:{message.get('tool_call_id', '')}"
        elif role == "assistant" and message.get("tool_calls"):
            key = "call:" + ",".join(str(c.get("id", "")) for c in message["tool_calls"] if isinstance(c, dict))
        else:
            key = f"{role}:{_digest(text_of(message.get('content')))}"
        count = seen.get(key, 0)
        seen[key] = count + 1
        keys.append(key if count == 0 else f"{key}#{count}")
    return keys


def tool_names(body: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            function = tool.get("function")
            names.append(str((function if isinstance(function, dict) else tool).get("name", "")))
    return names


def summary_diff(before: str, after: str) -> list[str]:
    return list(difflib.unified_diff(before.splitlines(), after.splitlines(), "previous", "current", lineterm=""))


def _notice_of(before: str, after: str) -> str:
    """What the shortened text has that the original does not: the agent's notice."""
    common = 0
    for a, b in zip(before, after, strict=False):
        if a != b:
            break
        common += 1
    return after[common:].strip()


def _path_in(notice: str) -> str:
    match = _PATH.search(notice)
    return (match.group(1) or match.group(2)) if match else ""


@dataclass
class RecordedRequest:
    """One chat-completions request as the agent sent it, and the reply it got."""

    seq: int
    body: dict[str, Any]
    reply_text: str = ""
    # The conversation id the client sent, if any: ContextLab's session header,
    # OpenInference's ``session.id``, GenAI's ``gen_ai.conversation.id``.
    session_header: str = ""
    reply_tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None  # what the provider said the call cost
    # Another id the client sent for its conversation (a gateway adapter's
    # X-Claude-Code-Session-Id, Codex's thread): the same weight as the header,
    # which wins when both are sent.
    client_conversation_id: str = ""
    trace_id: str = ""  # the OpenTelemetry trace the call was made in, when known
    resource: str = ""  # a digest of the sender's OpenTelemetry resource (its process), when known

    @property
    def client_id(self) -> str:
        return self.session_header or self.client_conversation_id

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [m for m in self.body.get("messages") or [] if isinstance(m, dict)]

    @property
    def system_prompt(self) -> str:
        messages = self.messages
        return text_of(messages[0].get("content")) if messages and messages[0].get("role") in (
            "system", "developer") else ""


@dataclass
class Event:
    """One thing the agent's context manager did between two requests."""

    kind: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.detail}


EVENT_KINDS: tuple[str, ...] = (
    "messages_dropped", "tool_output_shortened", "tool_output_cut_on_arrival", "summary_inserted",
    "summary_replaced", "summary_erased", "turn_split", "tool_pair_split", "system_prompt_changed",
    "tools_added", "tools_removed", "side_call",
)


@dataclass
class Observation:
    """What one request tells: which conversation, whether a side call, and the events."""

    seq: int
    conversation: str
    side_call: bool
    side_role: str = ""  # "compactor" once its reply shows up as a summary, else "side"
    thread: str = ""
    events: list[Event] = field(default_factory=list)
    message_count: int = 0
    appended: int = 0
    compaction: dict[str, Any] | None = None
    turn: int = 0
    trace: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "turn": self.turn, "conversation": self.conversation, "side_call": self.side_call,
                "side_role": self.side_role, "thread": self.thread, "message_count": self.message_count,
                "appended": self.appended, "compaction": self.compaction,
                "events": [e.to_dict() for e in self.events]}


@dataclass
class SideCall:
    seq: int
    thread: str
    system_prompt: str
    first_user_digest: str
    reply_text: str
    role: str = "side"


@dataclass
class Conversation:
    id: str
    system_prompt: str
    tools: list[str]
    messages: list[dict[str, Any]] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    summary_key: str = ""
    summary: str = ""
    summaries: list[dict[str, Any]] = field(default_factory=list)
    compactions: list[dict[str, Any]] = field(default_factory=list)
    side_calls: list[SideCall] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)
    last_reply: dict[str, Any] | None = None
    last_calls: dict[str, Any] | None = None  # the previous reply when it called tools
    turn: int = 0  # user messages seen so far, summaries excluded
    # Identity evidence (see ``identity_score``): every message key the
    # conversation sent or was answered with, the key its next request would
    # carry for the last reply, the ids the client sent, the traces and the sender.
    seen_keys: set[str] = field(default_factory=set)
    reply_key: str = ""
    # The keys the results of the last reply's tool calls will carry: they answer this conversation.
    result_keys: set[str] = field(default_factory=set)
    client_id: str = ""
    trace_ids: set[str] = field(default_factory=set)
    resource: str = ""
    tool_sizes: dict[str, list[tuple[int, int, bool]]] = field(default_factory=dict)
    observations: list[Observation] = field(default_factory=list)

    def quotes(self) -> list[str]:
        """Openings of the conversation's messages that a side call quoting it would contain."""
        found: list[str] = []
        for message in self.messages[1:]:
            text = _squash(text_of(message.get("content")))
            if len(text) >= MIN_QUOTE_CHARS:
                found.append(text[:QUOTE_CHARS])
        return found

    def tool_trajectories(self) -> dict[str, list[tuple[int, int, bool]]]:
        """Per tool call id: (request, bytes, notice present) each time the size or notice changed."""
        out: dict[str, list[tuple[int, int, bool]]] = {}
        for call_id, sizes in self.tool_sizes.items():
            steps: list[tuple[int, int, bool]] = []
            for seq, size, marked in sizes:
                if not steps or steps[-1][1:] != (size, marked):
                    steps.append((seq, size, marked))
            out[call_id] = steps
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "requests": self.requests, "compactions": self.compactions,
                "summaries": self.summaries, "side_calls": [
                    {"seq": s.seq, "thread": s.thread, "role": s.role} for s in self.side_calls],
                "tool_trajectories": {k: [list(s) for s in v] for k, v in self.tool_trajectories().items()}}


# -- conversation identity ----------------------------------------------------------------------

# A message shorter than this ("continue", "Working on it.", "ok") is what any
# conversation may say: sharing it proves nothing. Tool calls and results are
# known by their call ids and are never short in that sense.
DISTINCT_CHARS = 16
# What a candidate conversation needs to take a request, and what is decisive.
LINK_SCORE = 2
CLIENT_ID_SCORE = 1000


def _lead(messages: list[dict[str, Any]]) -> int:
    return 1 if messages and messages[0].get("role") in ("system", "developer") else 0


def _distinctive(key: str, message: dict[str, Any]) -> bool:
    if key.startswith(("tool:", "call:")):
        return True
    return len(_squash(text_of(message.get("content")))) >= DISTINCT_CHARS


def identity_score(request: RecordedRequest, keys: list[str], conversation: Conversation, *,
                   common: set[str]) -> int | None:
    """How strongly ``request`` continues ``conversation``; None when it cannot.

    Pure: reads the request, the conversation's evidence, and ``common``, the
    request's message keys that another conversation holds too. The evidence:

    * the client's own conversation id (``RecordedRequest.client_id``: a session
      header, ``session.id``, an adapter's client id): the same id is decisive, a
      different one rules the conversation out;
    * the system prompt: the same one +1, another one -2;
    * the request extends the conversation's previous request message for
      message (the order of messages, the first task included) +2;
    * messages the conversation sent or was answered with, held by no other
      conversation and not short (``DISTINCT_CHARS``) +1 each, at most +3;
    * the conversation's last message or its last reply is in the request (what
      an agent keeps when it compacts) +1;
    * a message holding a reply of the conversation's own side calls (the
      summary its compactor wrote) +3;
    * the same OpenTelemetry trace +1; another sender (resource) -1.

    A request that only opens a task (one user message the conversation never
    sent, nothing else) is a new conversation whatever else it shares, unless
    the client id or the conversation's own summary says otherwise.
    """
    client = request.client_id
    if client and conversation.client_id:
        return CLIENT_ID_SCORE if client == conversation.client_id else None
    messages = request.messages
    lead = _lead(messages)
    body = keys[lead:]
    # The summary an agent inserts sits at the front, after the system prompt and maybe the task.
    front = [text_of(m.get("content")) for m in messages[lead:lead + 3]]
    own_summary = any(
        len(reply) >= MIN_QUOTE_CHARS and any(reply in text for text in front)
        for reply in (s.reply_text.strip() for s in conversation.side_calls))
    if (not own_summary and len(body) == 1 and messages[lead].get("role") == "user"
            and body[0] not in conversation.seen_keys):
        return None
    score = 0
    system = request.system_prompt
    if system or conversation.system_prompt:
        score += 1 if system == conversation.system_prompt else -2
    previous = conversation.keys[_lead(conversation.messages):]
    if previous and body[:len(previous)] == previous:
        score += 2
    distinct = [k for k, m in zip(body, messages[lead:], strict=True)
                if k in conversation.seen_keys and k not in common and _distinctive(k, m)]
    score += min(3, len(distinct))
    last = conversation.keys[-1] if len(conversation.keys) > _lead(conversation.messages) else ""
    if ((last and last in body) or (conversation.reply_key and conversation.reply_key in body)
            or any(k in conversation.result_keys for k in body)):
        score += 1
    if own_summary:
        score += 3
    if request.trace_id and request.trace_id in conversation.trace_ids:
        score += 1
    if request.resource and conversation.resource and request.resource != conversation.resource:
        score -= 1
    return score


def choose_conversation(scores: dict[str, int]) -> str | None:
    """The conversation with the best score of at least ``LINK_SCORE``; None when none reaches it
    or two share the best (evidence that fits two conversations equally links neither)."""
    ranked = sorted(scores.items(), key=lambda item: item[1], reverse=True)
    if not ranked or ranked[0][1] < LINK_SCORE:
        return None
    if len(ranked) > 1 and ranked[1][1] == ranked[0][1]:
        return None
    return ranked[0][0]


def _is_cut_notice(text: str) -> bool:
    return bool(_NOTICE.search(text))


class Observer:
    """Feeds requests in the order the agent sent them; keeps every conversation's state.

    With a token counter, each agent request also gets a ``contextlab.trace/1``
    record (``Observation.trace``) that the dashboard draws like a managed turn.
    """

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self.counter = counter
        self.conversations: dict[str, Conversation] = {}
        self._threads: dict[tuple[str, str], tuple[str, str]] = {}  # (system, first user) -> (conversation, thread)
        self._by_header: dict[str, str] = {}
        # Message key -> the conversations that sent it (or were answered with it):
        # a key two conversations hold links neither.
        self._holders: dict[str, set[str]] = {}

    # -- public ------------------------------------------------------------------------

    def observe(self, request: RecordedRequest) -> Observation:
        messages = request.messages
        system = request.system_prompt
        first_user = next((text_of(m.get("content")) for m in messages if m.get("role") == "user"), "")
        thread_key = (_digest(system), _digest(first_user))
        if thread_key in self._threads:
            conversation_id, thread = self._threads[thread_key]
            if thread:
                return self._side_call(request, self.conversations[conversation_id], thread, first_user)
        conversation = self._conversation_for(request)
        if conversation is None:
            parent = self._quoted_by(request)
            if parent is not None:
                thread = f"{parent.id}/side-{request.seq}"
                self._threads[thread_key] = (parent.id, thread)
                return self._side_call(request, parent, thread, first_user)
            conversation = self._new_conversation(request)
        if request.client_id:
            self._by_header.setdefault(request.client_id, conversation.id)
            conversation.client_id = conversation.client_id or request.client_id
        self._threads.setdefault(thread_key, (conversation.id, ""))
        return self._continue(conversation, request)

    def observe_all(self, requests: list[RecordedRequest]) -> list[Observation]:
        return [self.observe(r) for r in requests]

    # -- identity ----------------------------------------------------------------------

    def _conversation_for(self, request: RecordedRequest) -> Conversation | None:
        client = request.client_id
        if client and client in self._by_header:
            return self.conversations[self._by_header[client]]
        keys = message_keys(request.messages)
        holders = {k: held for k in keys if (held := self._holders.get(k))}
        scores: dict[str, int] = {}
        for conversation in self.conversations.values():
            others = {k for k, held in holders.items() if len(held) > 1 or conversation.id not in held}
            score = identity_score(request, keys, conversation, common=others)
            if score is not None:
                scores[conversation.id] = score
        chosen = choose_conversation(scores)
        return self.conversations[chosen] if chosen is not None else None

    def _quoted_by(self, request: RecordedRequest) -> Conversation | None:
        if not self.conversations:
            return None
        text = _squash(" ".join(text_of(m.get("content")) for m in request.messages[1:]))
        best: tuple[int, Conversation] | None = None
        for conversation in self.conversations.values():
            if request.system_prompt == conversation.system_prompt:
                continue
            hits = sum(1 for quote in conversation.quotes() if quote in text)
            if hits and (best is None or hits > best[0]):
                best = (hits, conversation)
        return best[1] if best else None

    def _new_conversation(self, request: RecordedRequest) -> Conversation:
        conversation = Conversation(id=f"c{len(self.conversations) + 1}", system_prompt=request.system_prompt,
                                    tools=tool_names(request.body))
        self.conversations[conversation.id] = conversation
        return conversation

    # -- side calls --------------------------------------------------------------------

    def _side_call(self, request: RecordedRequest, conversation: Conversation, thread: str,
                   first_user: str) -> Observation:
        call = SideCall(seq=request.seq, thread=thread, system_prompt=request.system_prompt,
                        first_user_digest=_digest(first_user), reply_text=request.reply_text)
        conversation.side_calls.append(call)
        observation = Observation(seq=request.seq, conversation=conversation.id, side_call=True, side_role="side",
                                  thread=thread, message_count=len(request.messages), turn=conversation.turn)
        observation.events.append(Event("side_call", {"thread": thread, "tools": len(tool_names(request.body)),
                                                      "reply_chars": len(request.reply_text)}))
        conversation.observations.append(observation)
        return observation

    # -- the diff between two requests of one conversation -----------------------------

    def _continue(self, conversation: Conversation, request: RecordedRequest) -> Observation:
        messages = request.messages
        keys = message_keys(messages)
        observation = Observation(seq=request.seq, conversation=conversation.id, side_call=False,
                                  message_count=len(messages))
        events = observation.events
        first = not conversation.requests
        if not first:
            self._system_and_tools(conversation, request, events)
            self._changes(conversation, messages, keys, observation)
        else:
            for message in messages:
                self._arrival(message, events)
            observation.appended = max(0, len(messages) - 1)
            conversation.turn = sum(1 for m in messages if m.get("role") == "user")
        for message in messages:
            if message.get("role") == "tool":
                content = text_of(message.get("content"))
                conversation.tool_sizes.setdefault(str(message.get("tool_call_id", "")), []).append(
                    (request.seq, byte_size(content), _is_cut_notice(content)))
        observation.turn = conversation.turn
        if observation.compaction is not None:
            observation.compaction["turn"] = conversation.turn
        if self.counter is not None:
            observation.trace = observed_trace(observation, request, len(conversation.requests) + 1,
                                               conversation, self.counter)
        conversation.messages = messages
        conversation.keys = keys
        conversation.last_reply = ({"role": "assistant", "content": request.reply_text}
                                   if request.reply_text and not request.reply_tool_calls else None)
        conversation.last_calls = ({"role": "assistant", "content": request.reply_text or None,
                                    "tool_calls": request.reply_tool_calls} if request.reply_tool_calls else None)
        reply: dict[str, Any] = {"role": "assistant", "content": request.reply_text or None}
        if request.reply_tool_calls:
            reply["tool_calls"] = request.reply_tool_calls
        conversation.reply_key = (message_keys([*messages, reply])[-1]
                                  if request.reply_text or request.reply_tool_calls else "")
        conversation.result_keys = {f"tool:{c.get('id', '')}" for c in request.reply_tool_calls
                                    if isinstance(c, dict) and c.get("id")}
        for key in (*keys, conversation.reply_key, *conversation.result_keys):
            if key:
                conversation.seen_keys.add(key)
                self._holders.setdefault(key, set()).add(conversation.id)
        if request.trace_id:
            conversation.trace_ids.add(request.trace_id)
        conversation.resource = request.resource or conversation.resource
        conversation.requests.append(request.seq)
        conversation.observations.append(observation)
        return observation

    def _system_and_tools(self, conversation: Conversation, request: RecordedRequest, events: list[Event]) -> None:
        system = request.system_prompt
        if system != conversation.system_prompt:
            events.append(Event("system_prompt_changed", {
                "chars_before": len(conversation.system_prompt), "chars_after": len(system),
                "diff": summary_diff(conversation.system_prompt, system)}))
            conversation.system_prompt = system
        names = tool_names(request.body)
        added = [n for n in names if n not in conversation.tools]
        removed = [n for n in conversation.tools if n not in names]
        if added:
            events.append(Event("tools_added", {"tools": added}))
        if removed:
            events.append(Event("tools_removed", {"tools": removed}))
        conversation.tools = names

    def _arrival(self, message: dict[str, Any], events: list[Event]) -> None:
        if message.get("role") != "tool":
            return
        content = text_of(message.get("content"))
        if _is_cut_notice(content):
            match = _NOTICE.search(content)
            notice = content[match.start():] if match else ""
            events.append(Event("tool_output_cut_on_arrival", {
                "tool_call_id": message.get("tool_call_id", ""), "bytes_after": byte_size(content),
                "kept_bytes": byte_size(content[:match.start()]) if match else byte_size(content),
                "notice": notice, "path": _path_in(notice)}))

    def _changes(self, conversation: Conversation, messages: list[dict[str, Any]], keys: list[str],
                 observation: Observation) -> None:
        events = observation.events
        before = dict(zip(conversation.keys, conversation.messages, strict=True))
        now_keys = set(keys)
        dropped = [(i, k) for i, k in enumerate(conversation.keys)
                   if i > 0 and k not in now_keys and k != conversation.summary_key]
        reply = conversation.last_reply
        called = conversation.last_calls
        if not dropped and called is not None and message_keys([called])[0] not in now_keys and \
                self._side_reply_position(conversation, messages, keys, before) is not None:
            # Nothing else left, but the tool calls of the previous reply never came
            # back and a summary did: the agent compacted them away before its next
            # request (Codex does when the reply's usage passes its limit).
            reply = called
        if (dropped or reply is called) and reply is not None:
            # The previous reply was never sent back: it went into the agent's
            # memory and out again in the same compaction.
            reply_key = message_keys([reply])[0]
            if reply_key not in now_keys:
                before[reply_key] = reply
                dropped.append((len(conversation.keys), reply_key))
        retained_positions = [i for i, k in enumerate(keys) if i > 0 and k in before]
        # Shortened tool outputs among the retained messages.
        for index in retained_positions:
            old, new = before[keys[index]], messages[index]
            if new.get("role") != "tool":
                continue
            old_text, new_text = text_of(old.get("content")), text_of(new.get("content"))
            if byte_size(new_text) < byte_size(old_text):
                notice = _notice_of(old_text, new_text) if not new_text.startswith(old_text) else ""
                if not notice and not old_text.startswith(new_text):
                    notice = _notice_of(old_text, new_text)
                events.append(Event("tool_output_shortened", {
                    "tool_call_id": new.get("tool_call_id", ""), "bytes_before": byte_size(old_text),
                    "bytes_after": byte_size(new_text), "silent": not _is_cut_notice(new_text),
                    "notice": notice, "path": _path_in(notice)}))
        # Messages the conversation sent before the previous request, sent again
        # (the task an agent keeps above its summary): neither new nor a summary.
        restored = {i for i, k in enumerate(keys) if i > 0 and k not in before and k in conversation.seen_keys
                    and k != conversation.reply_key and k not in conversation.result_keys}
        fresh = [i for i, k in enumerate(keys) if i > 0 and k not in before and i not in restored]
        summary_index = self._summary_index(conversation, messages, keys, fresh, retained_positions) if dropped else None
        summary_message = messages[summary_index] if summary_index is not None else None
        first_retained = retained_positions[0] if retained_positions else len(messages)
        if dropped and summary_index is None:
            # Some agents (Codex) put the summary after the messages they keep: a new
            # message holding the reply of one of the conversation's side calls is one.
            summary_index = self._side_reply_position(conversation, messages, keys, before)
            summary_message = messages[summary_index] if summary_index is not None else None
        new_positions = [i for i in fresh if i != summary_index]
        observation.appended = len(new_positions)
        conversation.turn += sum(1 for i in new_positions if messages[i].get("role") == "user")
        observation.turn = conversation.turn
        for index in new_positions:
            self._arrival(messages[index], events)
        if dropped:
            events.append(Event("messages_dropped", {
                "count": len(dropped), "messages": [self._brief(before[k], k) for _, k in dropped]}))
        if summary_message is not None:
            assert summary_index is not None
            self._summary(conversation, summary_message, keys[summary_index], observation, dropped,
                          messages, keys, first_retained)
        elif dropped and conversation.summary_key and conversation.summary_key not in now_keys:
            events.append(Event("summary_erased", {"version": len(conversation.summaries),
                                                   "dropped": len(dropped)}))
            observation.compaction = {"seq": observation.seq, "trigger": "auto", "dropped": len(dropped),
                                      "kept": len(retained_positions), "summary_version": None,
                                      "summary_erased": True, "compactor_seq": None}
            conversation.compactions.append(observation.compaction)
            conversation.summary_key = ""
        if dropped:
            self._splits(messages, keys, retained_positions, before, dropped, events)

    @staticmethod
    def _side_reply_position(conversation: Conversation, messages: list[dict[str, Any]], keys: list[str],
                             before: dict[str, dict[str, Any]]) -> int | None:
        replies = [s.reply_text.strip() for s in conversation.side_calls if s.reply_text.strip()]
        if not replies:
            return None
        for index, key in enumerate(keys):
            if index == 0 or key in before or messages[index].get("role") == "tool":
                continue
            text = text_of(messages[index].get("content"))
            if any(reply in text for reply in replies):
                return index
        return None

    @staticmethod
    def _summary_index(conversation: Conversation, messages: list[dict[str, Any]], keys: list[str],
                       fresh: list[int], retained: list[int]) -> int | None:
        """Where the summary sits in a request that dropped messages, if it holds one.

        The agent's new messages come last (its previous reply, a tool result, a new
        ask); a new message before them stands for what was dropped: kept last
        (``[system, summary, last K]``), after the task it kept (``[system, task,
        summary, ...]``) or before the previous reply (``[system, summary, reply,
        ask]``), as a user or a system message.
        """
        lead = _lead(messages)
        if conversation.reply_key and conversation.reply_key in keys:
            tail = keys.index(conversation.reply_key)
        elif retained:
            tail = max(retained) + 1
        else:
            tail = len(messages) - 1  # everything is new: the last message is the ask
        before_tail = [i for i in fresh if i < tail and messages[i].get("role") in ("user", "system", "developer")]
        if before_tail:
            return before_tail[0]
        if lead in fresh and lead < len(messages) - 1 and (not retained or lead < retained[0]):
            return lead
        after = [i for i in fresh if i >= tail]
        if (not conversation.reply_key or conversation.reply_key not in keys) and len(after) >= 2 and (
                messages[after[0]].get("role") in ("user", "system", "developer")):
            return after[0]  # [system, task, summary, ask]: the reply went into the summary
        return None

    def _summary(self, conversation: Conversation, message: dict[str, Any], key: str, observation: Observation,
                 dropped: list[tuple[int, str]], messages: list[dict[str, Any]], keys: list[str],
                 first_retained: int) -> None:
        wrapper = text_of(message.get("content"))
        compactor = next((s for s in reversed(conversation.side_calls)
                          if s.reply_text.strip() and s.reply_text.strip() in wrapper), None)
        text = compactor.reply_text.strip() if compactor else wrapper
        if compactor is not None:
            compactor.role = "compactor"
            for other in conversation.observations:
                if other.seq == compactor.seq:
                    other.side_role = "compactor"
        previous = conversation.summary
        version = len(conversation.summaries) + 1
        kind = "summary_replaced" if conversation.summary_key else "summary_inserted"
        retained = len([k for k in keys[1:] if k in set(conversation.keys)])
        # Between turns with nothing of the previous request kept: the user asked
        # for it (an agent's `/compact`); an automatic one fires mid-turn and keeps a tail.
        new_after = [m.get("role") for m in messages[(2 if messages[0].get("role") in ("system", "developer") else 1):]]
        manual = retained == 0 and new_after == ["user"]
        record = {"version": version, "seq": observation.seq, "text": text, "wrapper_chars": len(wrapper),
                  "compactor_seq": compactor.seq if compactor else None,
                  "diff": summary_diff(previous, text) if previous else []}
        conversation.summaries.append(record)
        observation.events.append(Event(kind, {
            "version": version, "chars": len(text), "compactor_seq": record["compactor_seq"],
            "replaces_messages": len(dropped), "diff": record["diff"]}))
        observation.compaction = {"seq": observation.seq, "trigger": "manual" if manual else "auto",
                                  "dropped": len(dropped), "kept": retained, "summary_version": version,
                                  "summary_erased": False, "compactor_seq": record["compactor_seq"]}
        conversation.compactions.append(observation.compaction)
        conversation.summary_key = key
        conversation.summary = text

    def _splits(self, messages: list[dict[str, Any]], keys: list[str], retained: list[int],
                before: dict[str, dict[str, Any]], dropped: list[tuple[int, str]], events: list[Event]) -> None:
        if not retained:
            return
        first = messages[retained[0]]
        if first.get("role") != "user":
            events.append(Event("turn_split", {
                "first_kept_role": first.get("role"), "first_kept": keys[retained[0]],
                "detail": "the first kept message answers a user message that was dropped"}))
        dropped_keys = {k for _, k in dropped}
        kept_calls = {str(c.get("id")) for i in retained for c in (messages[i].get("tool_calls") or [])
                      if isinstance(c, dict)}
        for index in retained:
            message = messages[index]
            if message.get("role") == "tool" and str(message.get("tool_call_id")) not in kept_calls:
                events.append(Event("tool_pair_split", {"tool_call_id": message.get("tool_call_id"),
                                                        "detail": "result kept, its call dropped"}))
        for call_id in kept_calls:
            if f"tool:{call_id}" in dropped_keys:
                events.append(Event("tool_pair_split", {"tool_call_id": call_id,
                                                        "detail": "call kept, its result dropped"}))

    @staticmethod
    def _brief(message: dict[str, Any], key: str) -> dict[str, Any]:
        content = text_of(message.get("content"))
        if message.get("tool_calls"):
            content = (content + " " if content else "") + json.dumps(message["tool_calls"], ensure_ascii=False)
        return {"key": key, "role": message.get("role", ""), "bytes": byte_size(content), "content": content}


def load_recorded_request(data: dict[str, Any], seq: int) -> RecordedRequest:
    """A request log record: either ``{"body": ..., "response_text": ...}`` or a bare request body."""
    inner = data.get("body")
    body: dict[str, Any] = inner if isinstance(inner, dict) else data
    reply = data.get("response_text") or data.get("reply_text") or ""
    return RecordedRequest(seq=data["seq"] if isinstance(data.get("seq"), int) else seq,
                           body=body, reply_text=str(reply),
                           reply_tool_calls=list(data.get("response_tool_calls") or []),
                           usage=data["usage"] if isinstance(data.get("usage"), dict) else None,
                           session_header=str(data.get("session_id") or ""),
                           client_conversation_id=str(data.get("client_id") or ""),
                           trace_id=str(data.get("trace_id") or ""), resource=str(data.get("resource") or ""))


def requests_report(observer: Observer) -> dict[str, Any]:
    """What the inference found in a request log, per conversation (JSON-serialisable)."""
    conversations: list[dict[str, Any]] = []
    for conversation in observer.conversations.values():
        counts: dict[str, int] = {}
        for observation in conversation.observations:
            for event in observation.events:
                counts[event.kind] = counts.get(event.kind, 0) + 1
        trajectories = conversation.tool_trajectories()
        conversations.append({
            "id": conversation.id,
            "requests": len(conversation.requests),
            "side_calls": len(conversation.side_calls),
            "compactor_calls": [s.seq for s in conversation.side_calls if s.role == "compactor"],
            "turns": conversation.turn,
            "compactions": conversation.compactions,
            "summaries": [{"version": s["version"], "seq": s["seq"], "chars": len(s["text"]),
                           "diff_lines": len(s["diff"])} for s in conversation.summaries],
            "tool_results": len(trajectories),
            "truncated_tool_results": [
                {"id": call_id, "sizes": [{"request": seq, "bytes": size, "notice": marked}
                                          for seq, size, marked in steps]}
                for call_id, steps in trajectories.items()
                if len({size for _, size, _ in steps}) > 1 or any(marked for _, _, marked in steps)],
            "events": counts,
        })
    return {"requests": sum(c["requests"] + c["side_calls"] for c in conversations),
            "conversations": conversations}


def render_requests_report(report: dict[str, Any]) -> str:
    lines = [f"{report['requests']} requests, {len(report['conversations'])} conversation(s)"]
    for c in report["conversations"]:
        lines.append(f"{c['id']}: {c['requests']} requests, {c['side_calls']} side calls "
                     f"(compactor: {', '.join(map(str, c['compactor_calls'])) or 'none'}), {c['turns']} turns")
        for compaction in c["compactions"]:
            lines.append(f"  request {compaction['seq']} (turn {compaction.get('turn')}): {compaction['trigger']} "
                         f"compaction, {compaction['dropped']} dropped, {compaction['kept']} kept, "
                         + (f"summary v{compaction['summary_version']}" if compaction["summary_version"]
                            else "summary erased"))
        lines.append(f"  tool results: {c['tool_results']}, {len(c['truncated_tool_results'])} shortened")
        for row in c["truncated_tool_results"]:
            sizes = " -> ".join(f"{s['bytes']}B{'+notice' if s['notice'] else ''} (req {s['request']})"
                                for s in row["sizes"])
            lines.append(f"    {row['id']}: {sizes}")
    return "\n".join(lines)


# -- the trace of an observed request ----------------------------------------------------------

# Tokens of one OpenAI message, by counter and content: a conversation resends the
# same messages on every request, and the gateway re-reads all of them per call.
_TOKEN_CACHE: dict[tuple[str, str], int] = {}
_TOKEN_CACHE_LIMIT = 100_000


def _message_tokens(message: dict[str, Any], calls: dict[str, str], counter: TokenCounter) -> int:
    key = (getattr(counter, "key", type(counter).__name__),
           _digest(json.dumps(message, sort_keys=True, ensure_ascii=False, default=str)))
    cached = _TOKEN_CACHE.get(key)
    if cached is not None:
        return cached
    try:
        count = counter.count_messages(from_openai([message], known_calls=calls))
    except ContextLabError:
        # Not a message the converter accepts: count its text alone.
        count = counter.count_text(text_of(message.get("content")))
    if len(_TOKEN_CACHE) >= _TOKEN_CACHE_LIMIT:
        _TOKEN_CACHE.clear()
    _TOKEN_CACHE[key] = count
    return count


def count_request_tokens(messages: list[dict[str, Any]], counter: TokenCounter) -> dict[str, int]:
    """Exact tokens of a request's layers: system prompt, the tool results, the other messages."""
    calls = {str(c.get("id")): "" for m in messages for c in (m.get("tool_calls") or []) if isinstance(c, dict)}
    counts = {"system": 0, "messages": 0, "tool_results": 0}
    for index, message in enumerate(messages):
        layer = ("system" if index == 0 and message.get("role") in ("system", "developer")
                 else "tool_results" if message.get("role") == "tool" else "messages")
        counts[layer] += _message_tokens(message, calls, counter)
    counts["total"] = counts["system"] + counts["messages"] + counts["tool_results"]
    return counts


def _step(name: str, status: str, outcome: str, *, numbers: dict[str, Any] | None = None,
          inputs: dict[str, Any] | None = None, details: dict[str, Any] | None = None,
          reasons: list[str] | None = None) -> dict[str, Any]:
    return {"step": name, "status": status, "started_at": "", "duration_ms": 0.0, "inputs": inputs or {},
            "numbers": numbers or {}, "outcome": outcome, "reasons": reasons or [], "details": details or {}}


def observed_trace(observation: Observation, request: RecordedRequest, turn: int, conversation: Conversation,
                   counter: TokenCounter) -> dict[str, Any]:
    """The request as a ``contextlab.trace/1`` turn: what the agent's own context manager did before it."""
    messages = request.messages
    tokens = count_request_tokens(messages, counter)
    events = {e.kind: e for e in observation.events}
    by_kind: dict[str, list[Event]] = {}
    for event in observation.events:
        by_kind.setdefault(event.kind, []).append(event)
    compaction = observation.compaction
    summary_event = events.get("summary_inserted") or events.get("summary_replaced")
    summary_tokens = 0
    if compaction is not None or conversation.summary_key:
        lead = messages[1] if len(messages) > 1 else {}
        summary_tokens = counter.count_text(text_of(lead.get("content"))) if conversation.summary_key else 0
    steps: list[dict[str, Any]] = []
    steps.append(_step("gate", "ok", "observed: the agent's own context manager decided",
                       numbers={"system_tokens": tokens["system"], "summary_tokens": summary_tokens,
                                "messages_tokens": tokens["messages"] + tokens["tool_results"] - summary_tokens,
                                "message_count": len(messages)},
                       reasons=[f"request {request.seq}, inferred from the difference with the previous request"]))
    cuts = by_kind.get("tool_output_shortened", []) + by_kind.get("tool_output_cut_on_arrival", [])
    rows = [{"tool": e.detail.get("tool_call_id", ""), "message_id": e.detail.get("tool_call_id", ""),
             "bytes_before": e.detail.get("bytes_before"), "bytes_after": e.detail.get("bytes_after"),
             "file": e.detail.get("path") or None, "silent": e.detail.get("silent", False),
             "notice": e.detail.get("notice", "")[:300]} for e in cuts]
    steps.append(_step(
        "tool_result_compaction", "fired" if cuts else "ok",
        f"{len(cuts)} tool output(s) cut by the agent" if cuts else "no tool output cut",
        numbers={"changed": len(by_kind.get("tool_output_shortened", [])),
                 "cut_on_arrival": len(by_kind.get("tool_output_cut_on_arrival", []))},
        details={"changed": rows},
        reasons=[f"{r['message_id']}: cut with no notice" for r in rows if r["silent"]]))
    losses: list[dict[str, str]] = []
    outcome = "no_action"
    if compaction is not None:
        dropped = by_kind.get("messages_dropped", [Event("messages_dropped", {"count": 0, "messages": []})])[0]
        steps.append(_step("context_check", "fired", f"{compaction['dropped']} message(s) left the context",
                           numbers={"compact_count": compaction["dropped"], "keep_count": compaction["kept"]},
                           details={"dropped": [m["key"] for m in dropped.detail["messages"]]}))
        if summary_event is not None:
            mode = "incremental" if summary_event.kind == "summary_replaced" else "initial"
            steps.append(_step(
                "summary", "fired", f"summary v{summary_event.detail['version']} appeared in the request",
                inputs={"mode": mode, "message_count": compaction["dropped"],
                        "previous_summary_version": summary_event.detail["version"] - 1 or None,
                        "compactor": "the agent's own"},
                numbers={"summary_chars": summary_event.detail["chars"]},
                details={"compactor": f"side call, request {summary_event.detail['compactor_seq']}"
                         if summary_event.detail.get("compactor_seq") else "not seen"}))
            outcome = "compacted"
        else:
            steps.append(_step("validity", "failed", "the messages left with no summary in their place",
                               reasons=["the previous summary was erased"]))
            losses.append(flaw("failed_summary_drops_messages",
                               f"request {request.seq}: {compaction['dropped']} messages removed, summary erased"))
            outcome = "compaction_failed"
        steps.append(_step("mark_compressed", "fired", f"{compaction['dropped']} message(s) archived by the agent",
                           numbers={"archived": compaction["dropped"],
                                    "summary_version": compaction.get("summary_version")}))
    other = [e for e in observation.events if e.kind in (
        "turn_split", "tool_pair_split", "system_prompt_changed", "tools_added", "tools_removed")]
    if other:
        steps.append(_step("observed_changes", "warning", ", ".join(e.kind.replace("_", " ") for e in other),
                           reasons=[_describe(e) for e in other]))
    thrash = _thrash(conversation, observation)
    if thrash:
        losses.append(flaw("compaction_thrash", f"requests {', '.join(map(str, thrash))}: a compaction before "
                                                f"each of the last {len(thrash)} requests"))
    for event in by_kind.get("turn_split", []):
        losses.append(flaw("turn_split", f"request {request.seq}: {_describe(event)}"))
    for event in by_kind.get("tool_pair_split", []):
        losses.append(flaw("tool_pair_split", f"request {request.seq}: {_describe(event)}"))
    for row in rows:
        if row["silent"]:
            losses.append(flaw("silent_single_line_cut",
                               f"{row['message_id']}: {row['bytes_before']} -> {row['bytes_after']} bytes"))
    management = request.body.get("context_management")
    edits = provider_edits_step(management.get("edits"), management.get("applied_edits")) if isinstance(
        management, dict) else None
    if edits is not None:
        steps.append(edits)
    steps.append(_step("result", "ok", "the request as the agent sent it",
                       numbers={"total": tokens["total"], "system": tokens["system"], "summary": summary_tokens,
                                "messages": tokens["messages"] - summary_tokens,
                                "tool_results": tokens["tool_results"], "message_count": len(messages)}))
    keys = message_keys(messages)
    return {
        "schema": SCHEMA, "turn": turn, "trigger": compaction["trigger"] if compaction else "auto",
        "policy": "observed", "started_at": "", "finished_at": "", "duration_ms": 0.0,
        "counter": getattr(counter, "key", ""), "exact": bool(getattr(counter, "exact", False)),
        "budget": {}, "outcome": outcome, "steps": steps, "flaws_avoided": [], "copaw_losses": losses,
        "payload": {"message_count": len(messages), "first_message_id": keys[1] if len(keys) > 1 else "",
                    "last_message_id": keys[-1] if keys else "", "added_ids": [], "removed_ids": [],
                    "changed_ids": [], "pinned_message_ids": [],
                    "summary_version": len(conversation.summaries),
                    "tokens": {"system": tokens["system"], "summary": summary_tokens,
                               "messages": tokens["messages"] - summary_tokens,
                               "tool_results": tokens["tool_results"], "total": tokens["total"]}},
        "error": None, "observed": {"request": request.seq, "events": [e.to_dict() for e in observation.events]},
    }


# Compactions before this many agent requests in a row are thrash: the agent compacts
# again at once (Codex does when the usage it is told stays over its limit).
THRASH_RUN = 2


def _thrash(conversation: Conversation, observation: Observation) -> list[int]:
    """The requests of the run of compactions this one extends, when it is long enough; else []."""
    if observation.compaction is None:
        return []
    run = [observation.seq]
    for earlier in reversed(conversation.observations):
        if earlier.side_call:
            continue  # the compactor's own calls sit between the requests
        if earlier.compaction is None:
            break
        run.insert(0, earlier.seq)
    return run if len(run) >= THRASH_RUN else []


def _describe(event: Event) -> str:
    detail = event.detail
    if event.kind == "turn_split":
        return f"the first kept message is an {detail.get('first_kept_role')} message; its user message was dropped"
    if event.kind == "tool_pair_split":
        return f"{detail.get('tool_call_id')}: {detail.get('detail')}"
    if event.kind == "system_prompt_changed":
        return f"system prompt {detail.get('chars_before')} -> {detail.get('chars_after')} characters"
    if event.kind in ("tools_added", "tools_removed"):
        return f"{event.kind.replace('_', ' ')}: {', '.join(detail.get('tools') or [])}"
    return event.kind
