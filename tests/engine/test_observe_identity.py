"""Conversation identity: runs that share a short, common message are never merged."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contextlab.engine.observe.inference import (
    LINK_SCORE,
    Observer,
    RecordedRequest,
    choose_conversation,
)

TERSE = "Working on it."


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


@dataclass
class Run:
    """One agent run: its messages so far, and the replies an upstream that answers tersely gives."""

    name: str
    prompt: str
    task: str
    steps: list[str] = field(default_factory=lambda: ["continue", "continue"])
    tool_ids: tuple[str, ...] = ()
    trace_id: str = ""
    client_id: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)

    def requests(self, seqs: Iterator[int]) -> Iterator[RecordedRequest]:
        self.messages = [system(self.prompt), user(self.task)] if self.prompt else [user(self.task)]
        for call_id in self.tool_ids:
            # The fake upstream reuses its call ids in every run ("call_0", ...).
            call = {"id": call_id, "type": "function", "function": {"name": "shell", "arguments": "{}"}}
            yield RecordedRequest(seq=next(seqs), body={"messages": list(self.messages)}, reply_tool_calls=[call],
                                  trace_id=self.trace_id, client_conversation_id=self.client_id)
            self.messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                              {"role": "tool", "tool_call_id": call_id, "content": "ok"}]
        yield RecordedRequest(seq=next(seqs), body={"messages": list(self.messages)}, reply_text=TERSE,
                              trace_id=self.trace_id, client_conversation_id=self.client_id)
        for step in self.steps:
            self.messages += [answer(TERSE), user(step)]
            yield RecordedRequest(seq=next(seqs), body={"messages": list(self.messages)}, reply_text=TERSE,
                                  trace_id=self.trace_id, client_conversation_id=self.client_id)


def interleave(runs: list[Run], order: list[int]) -> list[tuple[str, RecordedRequest]]:
    """The runs' requests in the order ``order`` picks them (index into ``runs``, exhausted runs skipped)."""
    seqs = iter(range(1, 10_000))
    pending = {run.name: run.requests(seqs) for run in runs}
    out: list[tuple[str, RecordedRequest]] = []
    picks = [runs[i % len(runs)].name for i in order] + [run.name for run in runs for _ in range(20)]
    for name in picks:
        iterator = pending.get(name)
        if iterator is None:
            continue
        try:
            # The sequence number is taken when the request is made, so it follows the interleaving.
            out.append((name, next(iterator)))
        except StopIteration:
            del pending[name]
    return out


def observe(sent: list[tuple[str, RecordedRequest]]) -> tuple[Observer, dict[str, set[str]]]:
    observer = Observer()
    found: dict[str, set[str]] = {}
    for name, request in sent:
        observation = observer.observe(request)
        assert not observation.side_call, f"{name}'s request {request.seq} taken for a side call"
        found.setdefault(name, set()).add(observation.conversation)
    return observer, found


def assert_kept_apart(observer: Observer, found: dict[str, set[str]], runs: list[Run]) -> None:
    for run in runs:
        assert len(found[run.name]) == 1, f"{run.name} was split over {found[run.name]}"
    owners = [next(iter(found[run.name])) for run in runs]
    assert len(set(owners)) == len(runs), f"runs merged: {found}"
    for conversation in observer.conversations.values():
        assert conversation.compactions == [], f"{conversation.id}: compactions that never happened"


def test_it_keeps_two_runs_apart_that_share_continue_and_a_terse_reply() -> None:
    runs = [Run("a", "You are a release engineer. Ship the build.", "Tag version 2.4.1 and publish the wheel."),
            Run("b", "You are a documentation writer for the team.", "Rewrite the install guide for Windows.")]
    observer, found = observe(interleave(runs, [0, 1, 0, 1, 0, 1]))
    assert_kept_apart(observer, found, runs)
    assert sorted(c.turn for c in observer.conversations.values()) == [3, 3]


def test_it_keeps_three_interleaved_runs_apart_that_reuse_tool_call_ids() -> None:
    runs = [Run("a", "You maintain the billing service.", "Find why invoices are off by one cent.",
                tool_ids=("call_0", "call_1")),
            Run("b", "You review pull requests for style.", "Review the open pull request on the parser.",
                tool_ids=("call_0", "call_1")),
            Run("c", "You keep the servers patched.", "Patch the kernel on the staging hosts.",
                tool_ids=("call_0",))]
    observer, found = observe(interleave(runs, [0, 1, 2, 2, 1, 0, 0, 1, 2, 1, 0, 2]))
    assert_kept_apart(observer, found, runs)


def test_it_keeps_runs_of_one_agent_apart_when_only_the_task_differs() -> None:
    prompt = "You are a coding agent. Use the shell tool."
    runs = [Run("a", prompt, "Fix the nightly build."), Run("b", prompt, "Add a changelog entry."),
            Run("c", prompt, "Bump the numpy pin.")]
    observer, found = observe(interleave(runs, [0, 1, 2, 0, 1, 2, 2, 1, 0]))
    assert_kept_apart(observer, found, runs)


def test_it_follows_the_client_id_a_gateway_adapter_passes() -> None:
    # Two runs that are identical message for message: only the client's ids tell them apart.
    runs = [Run("a", "You are a coding agent.", "Fix the nightly build.", client_id="cc-session-1"),
            Run("b", "You are a coding agent.", "Fix the nightly build.", client_id="cc-session-2")]
    observer, found = observe(interleave(runs, [0, 1, 0, 1, 0, 1]))
    assert_kept_apart(observer, found, runs)


def test_it_links_by_the_trace_when_the_messages_alone_cannot_tell() -> None:
    # Each run keeps nothing but the system prompt and a bare "continue": its own trace links it.
    observer = Observer()
    prompt = system("You are a coding agent.")
    first = observer.observe(RecordedRequest(seq=1, body={"messages": [prompt, user("Fix the nightly build.")]},
                                             reply_text=TERSE, trace_id="t-a"))
    other = observer.observe(RecordedRequest(seq=2, body={"messages": [prompt, user("Add a changelog entry.")]},
                                             reply_text=TERSE, trace_id="t-b"))
    later = observer.observe(RecordedRequest(seq=3, body={"messages": [prompt, answer(TERSE), user("continue")]},
                                             trace_id="t-b"))
    assert first.conversation != other.conversation
    assert later.conversation == other.conversation


def test_it_links_nothing_when_two_conversations_fit_equally() -> None:
    assert choose_conversation({"c1": 3, "c2": 3}) is None
    assert choose_conversation({"c1": 3, "c2": 2}) == "c1"
    assert choose_conversation({"c1": LINK_SCORE - 1}) is None


@settings(max_examples=60, deadline=None)
@given(count=st.integers(min_value=2, max_value=4), shared_prompt=st.booleans(),
       order=st.lists(st.integers(min_value=0, max_value=3), min_size=4, max_size=30),
       steps=st.lists(st.sampled_from(["continue", "go on", "ok", "yes", "Working on it.", "next"]),
                      min_size=1, max_size=4))
def test_it_never_merges_runs_that_share_only_short_messages(count: int, shared_prompt: bool, order: list[int],
                                                              steps: list[str]) -> None:
    tasks = ["Fix the nightly build.", "Add a changelog entry.", "Bump the numpy pin.", "Translate the README."]
    runs = [Run(f"r{i}", "You are a coding agent." if shared_prompt else f"You are agent number {i}.",
                tasks[i], steps=list(steps)) for i in range(count)]
    observer, found = observe(interleave(runs, order))
    assert_kept_apart(observer, found, runs)
