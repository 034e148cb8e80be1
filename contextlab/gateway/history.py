"""Recognising the history an OpenAI client resends with every call.

Pure functions, no Django. A chat-completions client sends its whole
conversation each time; the gateway keeps, per session, one digest per message
it has already ingested and looks for that list at the start of the request.

A digest captures a message's identity and content, and ignores what clients
routinely change when they echo a reply back: key order, ``null`` versus
missing versus ``""`` content, extra response fields (``refusal``,
``annotations``, ``audio``), and the spacing of tool-call arguments. An
assistant message that calls tools is identified by its call ids alone: the
provider made them unique, and frameworks re-serialise the rest (LangChain
re-dumps arguments, some drop the text beside the calls).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

SYSTEM_ROLES = ("system", "developer")
DIGEST_CHARS = 32  # 128 bits of sha256: collisions are not a practical concern


def _canonical(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _hash(value: Any) -> str:
    return hashlib.sha256(_canonical(value).encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_CHARS]


def content_text(content: Any) -> str:
    """The content as one comparable string (text parts joined; other parts as JSON)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content).strip()
    return _canonical(content)


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    calls = message.get("tool_calls")
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def digest(message: Any) -> str:
    """The identity-and-content digest of one OpenAI chat message."""
    if not isinstance(message, dict):
        return _hash(["?", message])
    role = message.get("role")
    if role == "developer":
        role = "system"
    calls = _calls(message)
    if role == "assistant" and calls:
        return _hash(["assistant-calls", sorted(str(c.get("id", "")) for c in calls)])
    if role == "tool":
        return _hash(["tool", message.get("tool_call_id"), content_text(message.get("content"))])
    return _hash([role, content_text(message.get("content"))])


def chain_step(previous: str, message_digest: str) -> str:
    """The chained digest of a history one message longer: it stands for every digest before it, in order."""
    return hashlib.sha256(f"{previous}:{message_digest}".encode()).hexdigest()[:DIGEST_CHARS]


def chained(digests: Sequence[str], start: str = "") -> list[str]:
    """The chained digest after each message: ``chained(d)[i]`` stands for ``d[:i + 1]``."""
    out: list[str] = []
    previous = start
    for message_digest in digests:
        previous = chain_step(previous, message_digest)
        out.append(previous)
    return out


@dataclass(frozen=True)
class Ingested:
    """What a session's gateway row keeps of the history it ingested, in constant size:
    how many messages, the chained digest of all of them, and of all but the last
    (to recognise a repeat of the request the last reply answered)."""

    length: int = 0
    chain: str = ""
    before_last: str = ""

    @classmethod
    def of(cls, chains: Sequence[str]) -> Ingested:
        """The record of a history whose chained digests are ``chains``."""
        return cls(len(chains), chains[-1] if chains else "", chains[-2] if len(chains) > 1 else "")


def continues_chain(stored: Ingested, chains: Sequence[str]) -> bool:
    """``continues`` for a stored record and the request's chained digests: O(1)."""
    return stored.length <= len(chains) and (stored.length == 0 or chains[stored.length - 1] == stored.chain)


def repeats_chain(stored: Ingested, chains: Sequence[str]) -> bool:
    """``repeats`` for a stored record and the request's chained digests: O(1)."""
    return stored.length == len(chains) + 1 and stored.before_last == (chains[-1] if chains else "")


class PrefixDigests:
    """The digests of the messages a conversation sent last time, to digest only what is new.

    A client resends its whole history on every call, and digesting it all
    would cost a pass of JSON and SHA-256 over every message, growing with the
    conversation. Kept per conversation (bounded, least recently used first
    out): the last call's messages and their digests. A message equal to the
    one at the same position last time has the same digest; only the others
    (the new tail, and any the client changed) are digested.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._known: OrderedDict[Hashable, tuple[list[Any], list[str], list[str]]] = OrderedDict()

    def digests(self, conversation: Hashable, messages: Sequence[Any]) -> list[str]:
        return self.prefix(conversation, messages)[0]

    def prefix(self, conversation: Hashable, messages: Sequence[Any]) -> tuple[list[str], list[str]]:
        """(the digest of each message, the chained digest after each message)."""
        with self._lock:
            known_messages, known_digests, known_chains = self._known.pop(conversation, ([], [], []))
        # The unchanged head in one comparison of the two lists (C speed; equal
        # objects compare by identity first), then message by message from there.
        same = len(known_messages) if (len(known_messages) <= len(messages)
                                       and list(messages[:len(known_messages)]) == known_messages) else 0
        if not same:
            same = common_prefix(known_messages, messages)
        digests = known_digests[:same] + [digest(message) for message in messages[same:]]
        chains = known_chains[:same] + chained(digests[same:], known_chains[same - 1] if same else "")
        with self._lock:
            self._known[conversation] = (list(messages), digests, chains)
            while len(self._known) > self.size:
                self._known.popitem(last=False)
        return list(digests), list(chains)

    def clear(self) -> None:
        with self._lock:
            self._known.clear()


def split_system(messages: Sequence[Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """(the leading system/developer messages, everything after them)."""
    index = 0
    while (index < len(messages) and isinstance(messages[index], dict)
           and messages[index].get("role") in SYSTEM_ROLES):
        index += 1
    return list(messages[:index]), list(messages[index:])


def system_prompt(system_messages: Sequence[dict[str, Any]]) -> str:
    """The system prompt as the engine holds it: the leading system messages' text."""
    parts: list[str] = []
    for message in system_messages:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.append("".join(str(p.get("text", "")) for p in content if isinstance(p, dict)))
    return "\n\n".join(p for p in parts if p)


# Reminders coding agents (Claude Code) put ahead of what the user typed: not what a title should show.
_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)


def without_reminders(text: str) -> str:
    """The text with the agent's ``<system-reminder>`` sections taken out (for titles)."""
    return _REMINDER.sub(" ", text) if "<system-reminder>" in text else text


def first_user(messages: Sequence[Any]) -> Any:
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            return message
    return None


def derived_key(*, profile_id: int, system: str, first_user_message: Any, include_system: bool) -> str:
    """The stable name of a conversation whose client sent no session header."""
    first = content_text(first_user_message.get("content")) if isinstance(first_user_message, dict) else ""
    parts: list[Any] = [profile_id, system if include_system else None, first]
    return f"auto:{profile_id}:{_hash(parts)}"


def common_prefix(stored: Sequence[Any], incoming: Sequence[Any]) -> int:
    """How many leading items (messages or their digests) the two lists share."""
    n = 0
    for a, b in zip(stored, incoming, strict=False):
        if a != b:
            break
        n += 1
    return n


def continues(stored: Sequence[str], incoming: Sequence[str]) -> bool:
    """True when the incoming history starts with everything already ingested."""
    return len(stored) <= len(incoming) and common_prefix(stored, incoming) == len(stored)


def repeats(stored: Sequence[str], incoming: Sequence[str]) -> bool:
    """True when the incoming history is everything ingested but the last reply: the client
    sends the request that reply answered once more (it timed out first, or regenerates)."""
    return len(stored) == len(incoming) + 1 and common_prefix(stored, incoming) == len(incoming)


def reply_message(message: Any) -> dict[str, Any]:
    """The assistant reply of a completion, as it goes into the session.

    Only what a later request will send back matters: role, content, tool calls
    (and reasoning text); response-only fields (``refusal: null``,
    ``annotations``) would otherwise be replayed upstream in every later call.
    """
    source = message if isinstance(message, dict) else {}
    reply: dict[str, Any] = {"role": "assistant", "content": source.get("content")}
    if not isinstance(reply["content"], str | list):
        reply["content"] = None
    calls = []
    for call in _calls(source):
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        calls.append({"id": call.get("id"), "type": call.get("type") or "function",
                      "function": {"name": function.get("name") or "",
                                   "arguments": function.get("arguments") or ""}})
    if calls:
        reply["tool_calls"] = calls
    elif reply["content"] is None:
        # A refusal, or an empty answer: keep something the engine can hold.
        refusal = source.get("refusal")
        reply["content"] = refusal if isinstance(refusal, str) else ""
    reasoning = source.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        reply["reasoning_content"] = reasoning
    return reply
