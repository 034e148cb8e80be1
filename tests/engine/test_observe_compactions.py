"""The agent's own compactions, in every shape an agent sends them: each one is a compaction with its summary.

An agent that compacts sends ``[system, summary, last K]`` in one of several
shapes; the corpus below has one run per shape (and runs that chain them). The
observer must find one conversation per run, a compaction on each compacting
request with the summary the agent inserted, and a turn that reads "compacted".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from contextlab.engine.core.tokens import TiktokenCounter
from contextlab.engine.observe.inference import Observer, RecordedRequest

SYSTEM = {"role": "system", "content": "You are a coding agent working in the payments repository."}
TASK = {"role": "user", "content": "Refactor the payment module to use the new HTTP client."}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def call(call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "shell", "arguments": f'{{"step": "{call_id}"}}'}}]}


def result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": f"output of {call_id}: " + "line\n" * 30}


@dataclass
class Step:
    """One request the agent sends, the reply it gets, and the summary it inserted (when it compacts)."""

    messages: list[dict[str, Any]]
    reply: dict[str, Any]
    summary: str = ""
    trace_id: str = ""
    resource: str = ""


@dataclass
class Shape:
    name: str
    steps: list[Step] = field(default_factory=list)

    @property
    def summaries(self) -> list[str]:
        return [s.summary for s in self.steps if s.summary]


def _replies(messages: list[dict[str, Any]], replies: list[dict[str, Any]]) -> list[Step]:
    """The requests of an agent that appends each reply (and the tool's result) and asks again."""
    steps = []
    for reply in replies:
        steps.append(Step(list(messages), reply))
        messages = [*messages, reply]
        if reply.get("tool_calls"):
            messages.append(result(reply["tool_calls"][0]["id"]))
    return steps


def _after(step: Step) -> list[dict[str, Any]]:
    """What the agent holds after ``step``: its request, the reply, the reply's result."""
    held = [*step.messages, step.reply]
    if step.reply.get("tool_calls"):
        held.append(result(step.reply["tool_calls"][0]["id"]))
    return held


def _history(prefix: str = "c") -> list[Step]:
    return _replies([SYSTEM, TASK], [call(f"{prefix}1"), call(f"{prefix}2"), call(f"{prefix}3"),
                                     answer("The module now uses the new client and its tests pass.")])


SUMMARY_1 = "Summary of the work so far: the payment module was moved to the new HTTP client; tests pass."
SUMMARY_2 = "Summary of the work so far: new HTTP client in place; retries with backoff added to charge()."
SUMMARY_3 = "Summary of the work so far: client, retries and the changelog entry are done; docs remain."
NEXT_ASK = user("Now add retries with backoff to every request.")


def keep_last() -> Shape:
    steps = _history()
    held = [*_after(steps[-1]), NEXT_ASK]
    steps.append(Step(held, call("c4")))
    wrapper = f"<previous-summary>\n{SUMMARY_1}\n</previous-summary>"
    steps.append(Step([SYSTEM, user(wrapper), NEXT_ASK, call("c4"), result("c4")], call("c5"), summary=wrapper))
    return Shape("keep-last", steps)


def keep_task() -> Shape:
    steps = _history()
    held = [*_after(steps[-1]), NEXT_ASK]
    steps.append(Step(held, call("c4")))
    steps.append(Step([SYSTEM, TASK, user(SUMMARY_1), call("c4"), result("c4")], call("c5"), summary=SUMMARY_1))
    return Shape("keep-task", steps)


def keep_task_and_tail() -> Shape:
    steps = _history()
    held = [*_after(steps[-1]), NEXT_ASK]
    steps.append(Step(held, call("c4")))
    steps.append(Step([SYSTEM, TASK, user(SUMMARY_1), NEXT_ASK, call("c4"), result("c4")], call("c5"),
                      summary=SUMMARY_1))
    return Shape("keep-task+tail", steps)


def keep_none() -> Shape:
    steps = _history()
    held = [*_after(steps[-1]), NEXT_ASK]
    steps.append(Step(held, answer("Added retries with backoff to the three request helpers.")))
    steps.append(Step([SYSTEM, user(SUMMARY_1), steps[-1].reply, user("Now write the changelog entry for it.")],
                      answer("Done."), summary=SUMMARY_1))
    return Shape("keep-none", steps)


def summary_as_system() -> Shape:
    steps = _history()
    held = [*_after(steps[-1]), NEXT_ASK]
    steps.append(Step(held, call("c4")))
    summary = {"role": "system", "content": SUMMARY_1}
    steps.append(Step([SYSTEM, summary, NEXT_ASK, call("c4"), result("c4")], call("c5"), summary=SUMMARY_1))
    return Shape("summary-as-system", steps)


def several_in_a_row() -> Shape:
    steps = _history()
    held = [*_after(steps[-1]), NEXT_ASK]
    steps.append(Step(held, call("c4")))
    steps.append(Step([SYSTEM, user(SUMMARY_1), NEXT_ASK, call("c4"), result("c4")], call("c5"), summary=SUMMARY_1))
    # The next request compacts again at once: the new summary replaces the first.
    steps.append(Step([SYSTEM, user(SUMMARY_2), call("c4"), result("c4"), call("c5"), result("c5")], call("c6"),
                      summary=SUMMARY_2))
    steps.append(Step([SYSTEM, TASK, user(SUMMARY_3), call("c6"), result("c6")], answer("continue"),
                      summary=SUMMARY_3))
    return Shape("several-in-a-row", steps)


def after_resume() -> Shape:
    steps = _history()
    for step in steps:
        step.trace_id, step.resource = "trace-before", "process-1"
    # The agent's process restarts and resumes: the whole history again, from another process and trace.
    resumed = [*_after(steps[-1]), user("continue")]
    steps.append(Step(resumed, call("c4"), trace_id="trace-after", resource="process-2"))
    steps.append(Step([SYSTEM, user(SUMMARY_1), user("continue"), call("c4"), result("c4")], call("c5"),
                      summary=SUMMARY_1, trace_id="trace-after", resource="process-2"))
    return Shape("after-resume", steps)


SHAPES = [keep_last, keep_task, keep_task_and_tail, keep_none, summary_as_system, several_in_a_row, after_resume]


def _observe(observer: Observer, shape: Shape, seq: int = 0) -> list[tuple[Step, Any]]:
    out = []
    for step in shape.steps:
        seq += 1
        request = RecordedRequest(seq=seq, body={"model": "m", "messages": step.messages},
                                  reply_text=step.reply.get("content") or "",
                                  reply_tool_calls=step.reply.get("tool_calls") or [],
                                  trace_id=step.trace_id, resource=step.resource)
        out.append((step, observer.observe(request)))
    return out


@pytest.fixture(scope="module")
def counter() -> TiktokenCounter:
    return TiktokenCounter()


@pytest.mark.parametrize("make", SHAPES, ids=lambda make: make.__name__)
def test_it_recognises_each_compaction_shape_with_its_summary(make: Any, counter: TiktokenCounter) -> None:
    shape = make()
    observer = Observer(counter=counter)
    seen = _observe(observer, shape)
    assert len(observer.conversations) == 1, f"{shape.name}: split into {list(observer.conversations)}"
    conversation = next(iter(observer.conversations.values()))
    assert [c["summary_version"] for c in conversation.compactions] == list(range(1, len(shape.summaries) + 1))
    assert [s["text"] for s in conversation.summaries] == shape.summaries
    for step, observation in seen:
        assert not observation.side_call
        expected = "compacted" if step.summary else "no_action"
        assert observation.trace is not None and observation.trace["outcome"] == expected, (
            f"{shape.name}, request {observation.seq}: {observation.trace and observation.trace['outcome']}")


def test_it_keeps_every_shape_apart_when_the_runs_interleave(counter: TiktokenCounter) -> None:
    # The same runs, each with its own system prompt and task, one request of each in turn.
    runs = []
    for index, make in enumerate(SHAPES):
        shape = make()
        prompt = {"role": "system", "content": f"You are coding agent number {index} of the payments team."}
        task = {"role": "user", "content": f"Task {index}: refactor the payment module, part {index}."}
        for step in shape.steps:
            step.messages = [prompt if m is SYSTEM or m == SYSTEM else task if m == TASK else m for m in step.messages]
        runs.append(shape)
    observer = Observer(counter=counter)
    seq = 0
    found: dict[str, set[str]] = {}
    for position in range(max(len(r.steps) for r in runs)):
        for shape in runs:
            if position < len(shape.steps):
                seq += 1
                step = shape.steps[position]
                observation = observer.observe(RecordedRequest(
                    seq=seq, body={"messages": step.messages}, reply_text=step.reply.get("content") or "",
                    reply_tool_calls=step.reply.get("tool_calls") or [], trace_id=step.trace_id,
                    resource=step.resource))
                found.setdefault(shape.name, set()).add(observation.conversation)
    assert all(len(ids) == 1 for ids in found.values()), found
    assert len({next(iter(ids)) for ids in found.values()}) == len(runs)
    assert sum(len(c.compactions) for c in observer.conversations.values()) == sum(
        len(r.summaries) for r in runs)


def test_it_finds_the_summary_when_the_agent_folded_its_reply_into_it(counter: TiktokenCounter) -> None:
    steps = _history()
    held = [*_after(steps[-1]), NEXT_ASK]
    steps.append(Step(held, answer("Added retries with backoff to the three request helpers.")))
    steps.append(Step([SYSTEM, TASK, user(SUMMARY_2), user("Now write the changelog entry for it.")],
                      answer("Done."), summary=SUMMARY_2))
    observer = Observer(counter=counter)
    seen = _observe(observer, Shape("keep-task, reply folded", steps))
    assert len(observer.conversations) == 1
    assert [s["text"] for s in observer.conversations["c1"].summaries] == [SUMMARY_2]
    assert seen[-1][1].trace["outcome"] == "compacted"


# -- any number of kept messages, any interleaving ------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _run(tag: str, rounds: int, shape: str, keep: int, as_system: bool) -> Shape:
    """A run of ``rounds`` tool calls, then a compaction of ``shape`` keeping the last ``keep`` messages.

    A request of nothing but ``[system, summary, new ask]`` is left out on purpose: when the agent
    sends no conversation id and no trace, nothing in it says which conversation it continues
    (``test_a_bare_summary_and_ask_continue_only_by_id_or_trace``)."""
    system = {"role": "system", "content": f"You are coding agent {tag} of the payments team."}
    task = user(f"Task {tag}: refactor the payment module and report what changed.")
    steps = _replies([system, task], [call(f"{tag}-{i}") for i in range(rounds)])
    held = _after(steps[-1])
    summary_text = f"Summary for {tag}: {rounds} tool calls ran, the module is half refactored."
    summary = {"role": "system" if as_system else "user", "content": summary_text}
    ask = user(f"Go on with task {tag}, please, from the summary.")
    tail = held[len(held) - keep:]
    if shape == "keep-last":  # at least the newest message: with nothing at all, see the docstring
        messages = [system, summary, *tail]
    elif shape == "keep-task":
        messages = [system, task, summary, *tail, ask]
    else:  # keep-none: the summary, the agent's previous reply (a tool call and its result), a new ask
        messages = [system, summary, *held[-2:], ask]
    steps.append(Step(messages, answer(f"Continuing task {tag} now."), summary=summary_text))
    return Shape(shape, steps)


@settings(max_examples=40, deadline=None)
@given(runs=st.lists(st.tuples(st.integers(min_value=2, max_value=5),
                               st.sampled_from(["keep-last", "keep-task", "keep-none"]),
                               st.integers(min_value=0, max_value=3), st.booleans()),
                     min_size=1, max_size=3),
       order=st.lists(st.integers(min_value=0, max_value=2), max_size=40))
def test_every_compaction_of_interleaved_runs_is_found_once_in_its_own_run(runs, order) -> None:
    shapes = [_run(f"r{i}", rounds, shape, max(1, min(keep, 2 * rounds)), as_system)
              for i, (rounds, shape, keep, as_system) in enumerate(runs)]
    queues = [list(shape.steps) for shape in shapes]
    picks = [i % len(shapes) for i in order] + [i for i in range(len(shapes)) for _ in range(10)]
    observer = Observer()
    found: dict[int, set[str]] = {}
    seq = 0
    for index in picks:
        if not queues[index]:
            continue
        step = queues[index].pop(0)
        seq += 1
        observation = observer.observe(RecordedRequest(
            seq=seq, body={"messages": step.messages}, reply_text=step.reply.get("content") or "",
            reply_tool_calls=step.reply.get("tool_calls") or []))
        assert not observation.side_call
        found.setdefault(index, set()).add(observation.conversation)
    assert all(len(ids) == 1 for ids in found.values()), found
    assert len({next(iter(ids)) for ids in found.values()}) == len(shapes)
    for index, shape in enumerate(shapes):
        conversation = observer.conversations[next(iter(found[index]))]
        assert [s["text"] for s in conversation.summaries] == shape.summaries, shape.name


def test_a_bare_summary_and_ask_continue_only_by_id_or_trace() -> None:
    prompt = {"role": "system", "content": "You are the only agent with this prompt."}
    bare = [prompt, user("Summary: the nightly build was half fixed."), user("go on")]
    for trace, client, linked in (("", "", False), ("t-1", "", True), ("", "run-7", True)):
        observer = Observer()
        first = observer.observe(RecordedRequest(seq=1, body={"messages": [prompt, TASK]}, reply_text="On it.",
                                                 trace_id=trace, client_conversation_id=client))
        later = observer.observe(RecordedRequest(seq=2, body={"messages": bare}, trace_id=trace,
                                                 client_conversation_id=client))
        assert (later.conversation == first.conversation) is linked, (trace, client)
