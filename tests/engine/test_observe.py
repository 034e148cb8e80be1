"""Inferring an agent's own context management from the requests it sends."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextlab.engine.core.tokens import TiktokenCounter
from contextlab.engine.observe.inference import Observer, RecordedRequest, load_recorded_request
from tests.corpus import COPAW_RUN

SYSTEM = {"role": "system", "content": "You are a coding agent."}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def call(call_id: str, name: str = "shell") -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}]}


def result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def request(seq: int, messages: list[dict[str, Any]], *, reply: str = "", tools: tuple[str, ...] = ("shell",),
            header: str = "") -> RecordedRequest:
    body = {"model": "m", "messages": messages,
            "tools": [{"type": "function", "function": {"name": n, "parameters": {}}} for n in tools]}
    return RecordedRequest(seq=seq, body=body, reply_text=reply, session_header=header)


HISTORY = [SYSTEM, user("Turn 1: list the files in the project folder please"), call("c1"),
           result("c1", "a.py\n" * 400), answer("There are 400 files in the project folder."),
           user("Turn 2: now count the lines of every python file there")]


def test_it_reports_a_shortened_tool_output_with_its_notice_and_path() -> None:
    observer = Observer()
    observer.observe(request(1, HISTORY))
    cut = "a.py\n" * 20 + "<<<TRUNCATED>>>\nThe full content is saved to file_path=/ws/tool_result/ab12.txt"
    later = [*HISTORY[:3], result("c1", cut), *HISTORY[4:]]
    observation = observer.observe(request(2, later))
    [event] = [e for e in observation.events if e.kind == "tool_output_shortened"]
    assert event.detail["bytes_before"] == 2000
    assert event.detail["bytes_after"] == len(cut.encode())
    assert event.detail["notice"].startswith("<<<TRUNCATED>>>")
    assert event.detail["path"] == "/ws/tool_result/ab12.txt"
    assert event.detail["silent"] is False


def test_it_calls_a_cut_with_no_notice_silent() -> None:
    observer = Observer()
    observer.observe(request(1, HISTORY))
    observation = observer.observe(request(2, [*HISTORY[:3], result("c1", "a.py\n" * 10), *HISTORY[4:]]))
    [event] = [e for e in observation.events if e.kind == "tool_output_shortened"]
    assert event.detail["silent"] is True and event.detail["notice"] == ""


def test_it_recognises_a_summary_by_content_and_links_the_compactor_side_call() -> None:
    observer = Observer()
    observer.observe(request(1, HISTORY))
    compactor = request(2, [{"role": "system", "content": "Summarise the conversation."},
                            user("# conversation\nuser: Turn 1: list the files in the project folder please\n"
                                 "assistant: There are 400 files in the project folder.")],
                        reply="## Goal\nCount python lines.", tools=())
    side = observer.observe(compactor)
    assert side.side_call and side.conversation == "c1"
    after = [SYSTEM, user("Summary so far:\n## Goal\nCount python lines.\nContinue."), HISTORY[5]]
    observation = observer.observe(request(3, after))
    assert observation.conversation == "c1" and not observation.side_call
    kinds = [e.kind for e in observation.events]
    assert "summary_inserted" in kinds and "messages_dropped" in kinds
    dropped = next(e for e in observation.events if e.kind == "messages_dropped")
    assert dropped.detail["count"] == 4
    assert dropped.detail["messages"][0]["content"].startswith("Turn 1: list the files")
    conversation = observer.conversations["c1"]
    assert conversation.summaries[0]["text"] == "## Goal\nCount python lines."
    assert conversation.summaries[0]["compactor_seq"] == 2
    assert side.side_role == "compactor"
    assert conversation.compactions[0]["kept"] == 1


def test_it_diffs_a_replaced_summary_and_reports_a_split_turn() -> None:
    observer = Observer()
    observer.observe(request(1, HISTORY))
    second = [SYSTEM, user("Summary:\nturn 1 done"), HISTORY[5], call("c2"), result("c2", "ok"),
              answer("Counted them all."), user("Turn 3: run all the tests now please"), call("c3"),
              result("c3", "3 passed")]
    inserted = observer.observe(request(2, second))
    assert "summary_inserted" in [e.kind for e in inserted.events]
    third = [SYSTEM, user("Summary:\nturn 1 done\nturn 2 done"), call("c3"), result("c3", "3 passed")]
    observation = observer.observe(request(3, third))
    replaced = next(e for e in observation.events if e.kind == "summary_replaced")
    assert replaced.detail["version"] == 2
    assert "+turn 2 done" in replaced.detail["diff"]
    split = next(e for e in observation.events if e.kind == "turn_split")
    assert split.detail["first_kept_role"] == "assistant"


def test_it_reports_an_erased_summary_when_messages_go_without_one() -> None:
    observer = Observer()
    observer.observe(request(1, HISTORY))
    tail = [call("c2"), result("c2", "ok"), answer("Counted them all."), user("Turn 3: run all the tests now")]
    observer.observe(request(2, [SYSTEM, user("Summary:\nearlier work"), HISTORY[5], *tail]))
    observation = observer.observe(request(3, [SYSTEM, *tail]))
    kinds = [e.kind for e in observation.events]
    assert "summary_erased" in kinds and "turn_split" in kinds
    assert observer.conversations["c1"].compactions[-1]["summary_erased"] is True


def test_it_reports_changed_system_prompt_and_tools() -> None:
    observer = Observer()
    observer.observe(request(1, HISTORY))
    observation = observer.observe(request(2, [{"role": "system", "content": "You are a careful agent."},
                                               *HISTORY[1:], call("c9")], tools=("shell", "read_file")))
    kinds = {e.kind: e for e in observation.events}
    assert observation.conversation == "c1"
    assert kinds["tools_added"].detail["tools"] == ["read_file"]
    assert "system_prompt_changed" in kinds


def test_it_keeps_two_conversations_apart_and_follows_the_session_header() -> None:
    observer = Observer()
    a = observer.observe(request(1, HISTORY))
    b = observer.observe(request(2, [SYSTEM, user("A different task entirely: write a haiku about rain")]))
    assert a.conversation != b.conversation
    c = observer.observe(request(3, [SYSTEM, user("Summary: haiku"), user("Turn 2 of the haiku")], header="s-9"))
    d = observer.observe(request(4, [SYSTEM, user("Fresh summary, nothing kept"), user("go")], header="s-9"))
    assert c.conversation == d.conversation
    # The same messages under another header are another conversation.
    e = observer.observe(request(5, [SYSTEM, user("Summary: haiku"), user("Turn 2 of the haiku")], header="s-10"))
    assert e.conversation not in (a.conversation, b.conversation, c.conversation)


# -- the 75 requests of a real CoPaw 1.0.2 run ---------------------------------------------------

def copaw_requests() -> list[dict[str, Any]]:
    folder = COPAW_RUN / "requests"
    if not folder.is_dir():
        pytest.skip(f"the CoPaw sample is missing at {folder}")
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]


@pytest.fixture(scope="module")
def copaw_observer() -> Observer:
    observer = Observer()
    for record in copaw_requests():
        # The recording's "kind" label is for people: the inference never gets it.
        observer.observe(load_recorded_request({k: v for k, v in record.items() if k != "kind"}, record["seq"]))
    return observer


@pytest.fixture(scope="module")
def analysis() -> dict[str, Any]:
    return json.loads((COPAW_RUN / "analysis.json").read_text(encoding="utf-8"))


def test_it_finds_one_conversation_with_its_side_calls(copaw_observer: Observer, analysis: dict[str, Any]) -> None:
    assert list(copaw_observer.conversations) == ["c1"]
    conversation = copaw_observer.conversations["c1"]
    assert len(conversation.requests) == analysis["requests_by_kind"]["agent"]
    assert len(conversation.side_calls) == analysis["requests_by_kind"]["compactor"] + analysis[
        "requests_by_kind"]["summarizer"]
    compactors = [s.seq for s in conversation.side_calls if s.role == "compactor"]
    assert compactors == [c["seq"] for c in analysis["compactor_calls"]]


def test_it_finds_the_four_compactions_on_their_requests(copaw_observer: Observer,
                                                         analysis: dict[str, Any]) -> None:
    compactions = copaw_observer.conversations["c1"].compactions
    assert [c["seq"] for c in compactions] == [w["from_seq"] for w in analysis["summary_wrapper_changes"]]
    assert [c["trigger"] for c in compactions] == ["auto", "auto", "manual", "auto"]
    # Each compaction archived what the dialog file holds for it (27 + 33 + 25 + 16 lines).
    assert [c["dropped"] for c in compactions] == [27, 33, 25, 16]
    assert sum(c["dropped"] for c in compactions) == sum(analysis["dialog_files"].values())
    assert [c["compactor_seq"] for c in compactions] == [c["seq"] for c in analysis["compactor_calls"]]


def test_it_follows_every_tool_result_as_analysis_does(copaw_observer: Observer, analysis: dict[str, Any]) -> None:
    trajectories = copaw_observer.conversations["c1"].tool_trajectories()
    for row in analysis["tool_rows"]:
        ours = [f"req{s:04d}:{b}B{'+marker' if m else ''}" for s, b, m in trajectories[row["id"]]]
        assert ours == row["trajectory"], row["id"]
    shrunk = [k for k, v in trajectories.items() if len({b for _, b, _ in v}) > 1 or any(m for _, _, m in v)]
    assert len(trajectories) == analysis["tool_results_total"]
    assert len(shrunk) == analysis["tool_results_shrunk_any_way"]


def test_it_keeps_the_summary_versions_and_their_diffs(copaw_observer: Observer, analysis: dict[str, Any]) -> None:
    summaries = copaw_observer.conversations["c1"].summaries
    assert [s["version"] for s in summaries] == [1, 2, 3, 4]
    assert len(summaries[-1]["text"]) == analysis["session_summary_chars"]
    assert summaries[0]["diff"] == [] and all(s["diff"] for s in summaries[1:])
    assert "Compaction #2" in summaries[1]["text"]


def test_it_reports_the_split_turn_of_the_second_compaction(copaw_observer: Observer) -> None:
    observations = {o.seq: o for o in copaw_observer.conversations["c1"].observations}
    assert "turn_split" in [e.kind for e in observations[40].events]
    assert all("turn_split" not in [e.kind for e in observations[s].events] for s in (18, 55, 69))


@given(st.lists(st.sampled_from(["user", "tool", "answer"]), min_size=1, max_size=25))
@settings(max_examples=60, deadline=None)
def test_it_infers_nothing_but_arrivals_when_the_agent_only_appends(steps: list[str]) -> None:
    observer = Observer()
    messages: list[dict[str, Any]] = [SYSTEM, user("Turn 0: the opening request of this conversation")]
    observer.observe(request(0, messages))
    for index, step in enumerate(steps, start=1):
        if step == "user":
            messages = [*messages, user(f"Turn {index}: another request of the same conversation")]
        elif step == "tool":
            messages = [*messages, call(f"c{index}"), result(f"c{index}", "x" * index)]
        else:
            messages = [*messages, answer(f"Answer number {index} of the agent")]
        observation = observer.observe(request(index, messages))
        assert observation.conversation == "c1" and not observation.side_call
        assert observation.events == [] and observation.compaction is None
    assert observer.conversations["c1"].compactions == []


def test_it_writes_a_trace_per_agent_request_with_exact_tokens() -> None:
    from contextlab.engine.core.tokens import TiktokenCounter

    counter = TiktokenCounter()
    observer = Observer(counter=counter)
    traces = []
    for record in copaw_requests():
        observation = observer.observe(load_recorded_request(
            {k: v for k, v in record.items() if k != "kind"}, record["seq"]))
        if observation.trace is not None:
            traces.append(observation.trace)
    assert len(traces) == 59
    assert [t["turn"] for t in traces] == list(range(1, 60))
    assert [t["observed"]["request"] for t in traces if t["outcome"] == "compacted"] == [18, 40, 55, 69]
    first = traces[0]
    system = copaw_requests()[0]["body"]["messages"][0]["content"][0]["text"]
    assert first["payload"]["tokens"]["system"] >= counter.count_text(system)
    assert first["payload"]["tokens"]["total"] == sum(
        first["payload"]["tokens"][k] for k in ("system", "summary", "messages", "tool_results"))
    split = next(t for t in traces if t["observed"]["request"] == 40)
    assert [loss["name"] for loss in split["copaw_losses"]] == ["turn_split"]


def _thrash_requests() -> list[RecordedRequest]:
    system = {"role": "system", "content": "You are a coding agent."}
    return [
        RecordedRequest(seq=1, body={"messages": [
            system, {"role": "user", "content": "Fix the parser."}, {"role": "assistant", "content": "Reading it."},
            {"role": "user", "content": "Also the lexer."}]}),
        RecordedRequest(seq=2, body={"messages": [
            system, {"role": "user", "content": "Summary 1: parser read."}, {"role": "user", "content": "Also the lexer."},
            {"role": "assistant", "content": "Lexer next."}, {"role": "user", "content": "And the tests."}]}),
        RecordedRequest(seq=3, body={"messages": [
            system, {"role": "user", "content": "Summary 2: parser and lexer read."},
            {"role": "user", "content": "And the tests."}, {"role": "assistant", "content": "Tests next."},
            {"role": "user", "content": "Go on."}]}),
    ]


def test_it_flags_compaction_on_every_request_as_thrash():
    observer = Observer(counter=TiktokenCounter())
    traces = [observer.observe(r).trace for r in _thrash_requests()]
    assert [t["outcome"] for t in traces] == ["no_action", "compacted", "compacted"]
    flaws = [[loss["name"] for loss in t["copaw_losses"]] for t in traces]
    assert "compaction_thrash" not in flaws[1]
    assert "compaction_thrash" in flaws[2]
    thrash = next(loss for loss in traces[2]["copaw_losses"] if loss["name"] == "compaction_thrash")
    assert thrash["detail"].startswith("requests 2, 3:")


def test_it_finds_a_summary_the_agent_put_after_the_messages_it_kept():
    """Codex's shape: the developer and user messages kept, its compactor's answer appended."""
    system = {"role": "system", "content": "You are a coding agent working in a terminal."}
    ask = {"role": "user", "content": "What does notes.txt say? Read it with cat please."}
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}]}
    output = {"role": "tool", "tool_call_id": "c1", "content": "alpha-7, the first line of notes.txt"}
    observer = Observer(counter=TiktokenCounter())
    observer.observe(RecordedRequest(seq=1, body={"messages": [system, ask, call, output]}))
    summary = "SUMMARY: notes.txt says alpha-7."
    observer.observe(RecordedRequest(seq=2, reply_text=summary, body={"messages": [
        {"role": "system", "content": "You are performing a CONTEXT CHECKPOINT COMPACTION."},
        {"role": "user", "content": "user: What does notes.txt say? Read it with cat please.\n\n"
                                    "tool: alpha-7, the first line of notes.txt"}]}))
    after = observer.observe(RecordedRequest(seq=3, body={"messages": [
        system, ask, {"role": "user", "content": f"Another language model produced a summary:\n{summary}"}]}))
    assert after.compaction is not None and after.compaction["compactor_seq"] == 2
    assert after.compaction["dropped"] == 2
    assert [e.kind for e in after.events if e.kind.startswith("summary")] == ["summary_inserted"]


def test_it_counts_a_tool_call_compacted_away_before_it_came_back():
    """Codex compacts between a reply that calls a tool and the request that would carry the call."""
    system = {"role": "system", "content": "You are a coding agent working in a terminal."}
    ask = {"role": "user", "content": "What does notes.txt say? Read it with cat please."}
    calls = [{"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{\"cmd\": \"cat notes.txt\"}"}}]
    observer = Observer(counter=TiktokenCounter())
    observer.observe(RecordedRequest(seq=1, body={"messages": [system, ask]}, reply_tool_calls=calls))
    summary = "SUMMARY: the user wants notes.txt read; cat was called."
    observer.observe(RecordedRequest(seq=2, reply_text=summary, body={"messages": [
        {"role": "system", "content": "You are performing a CONTEXT CHECKPOINT COMPACTION."},
        {"role": "user", "content": "user: What does notes.txt say? Read it with cat please."}]}))
    after = observer.observe(RecordedRequest(seq=3, body={"messages": [
        system, ask, {"role": "user", "content": f"Another language model produced a summary:\n{summary}"}]}))
    assert after.compaction is not None and after.compaction["dropped"] == 1
    dropped = next(e for e in after.events if e.kind == "messages_dropped")
    assert [m["key"] for m in dropped.detail["messages"]] == ["call:c1"]
