"""Importing every transcript of the shared corpus, and what bad files get."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contextlab.engine.core.errors import InvalidMessages, MalformedInput, UnknownFormat
from contextlab.engine.core.messages import check_sequence
from contextlab.engine.importers import KNOWN_FORMATS, Transcript, detect_transcript_format, load_transcript
from contextlab.engine.importers._common import NO_RESULT_TEXT

CORPUS = Path(
    os.environ.get(
        "CONTEXTLAB_CORPUS_DIR", Path(__file__).resolve().parents[2].parent / "shared" / "corpus" / "raw"
    )
)


def corpus_file(relative: str) -> Path:
    path = CORPUS / relative
    if not path.is_file():
        pytest.fail(
            f"corpus file {path} is missing: set CONTEXTLAB_CORPUS_DIR to the folder holding "
            "the 13 raw transcripts (shared/corpus/raw)"
        )
    return path


@dataclass(frozen=True)
class Expected:
    path: str
    format: str
    readme_msgs: int  # the README's "msgs" column
    tool_calls: int  # the README's "tool calls" column
    messages: int  # what we import, see `comparable_count`
    warnings: int


# How we count, to compare with the README's "msgs" (messages as OpenAI chat
# messages): our message list, plus the system prompt when we lifted it out of
# the list (the README counts it as a message), minus the synthetic results we
# add for calls that never got one, minus Claude Code's compact_boundary note
# (a system record the README does not count). With that, the counts match the
# README exactly.
CASES = [
    Expected("marot-spotter/fa812bfe-b295-4cca-9c2f-fdf01028cb46.jsonl", "claude_code", 358, 197, 359, 0),
    Expected("marot-spotter/fa812bfe-b295-4cca-9c2f-fdf01028cb46/subagents/agent-acompact-70d8e7.jsonl",
             "claude_code", 15, 0, 15, 0),
    Expected("marot-spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl", "claude_code", 466, 242, 467, 0),
    Expected("marot-spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04/subagents/agent-aac57f5.jsonl",
             "claude_code", 16, 12, 16, 0),
    Expected("marot-spotter/258c7280-ae70-4798-800f-63464d01a85d/subagents/agent-a881341.jsonl",
             "claude_code", 6, 2, 6, 0),
    # 101 events that reach the model: the system prompt is lifted out.
    Expected("openhands/multi_swe_bench_output.ponylang__ponyc-4588.jsonl", "openhands", 101, 49, 100, 0),
    # Five calls reuse an id from earlier in the session: renamed, one warning each.
    Expected("tau-bench/gpt-4o-airline.idx52.task2.trial1.json", "tau_bench", 62, 27, 61, 5),
    Expected("deer-flow/demo-threads/fe3f7974-1bcb-4a01-a950-79673baafefd/thread.json", "langgraph", 74, 35, 74, 0),
    # One result stored after a later assistant message: moved, one warning.
    Expected("deer-flow/demo-threads/b83fbb2a-4e36-4d82-9de0-7b2a02c2092a/thread.json", "langgraph", 27, 17, 27, 1),
    Expected("deer-flow/demo-threads/5aa47db1-d0cb-4eb9-aea5-3dac1b371c5a/thread.json", "langgraph", 39, 17, 39, 0),
    # handoff_to_planner never gets a result: one synthetic result, one warning.
    Expected("deer-flow/v1-replay/china-food-delivery.txt", "deerflow_sse", 25, 10, 26, 1),
    Expected("reme/cookbook-simple_demo-messages.jsonl", "reme_list", 10, 5, 10, 0),
    # The replayed run reuses call ids four times.
    Expected("swe-agent/replay__marshmallow-1867__function_calling_replace_from_source.traj",
             "swe_agent", 28, 13, 27, 4),
]
_LOADED: dict[str, Transcript] = {}


def load(relative: str) -> Transcript:
    if relative not in _LOADED:
        _LOADED[relative] = load_transcript(corpus_file(relative))
    return _LOADED[relative]


def comparable_count(transcript: Transcript) -> int:
    count = len(transcript.messages)
    count -= sum(1 for m in transcript.messages if m.metadata.get("synthetic"))
    count -= sum(1 for m in transcript.messages if m.metadata.get("compact_boundary"))
    return count + (1 if transcript.system_prompt is not None else 0)


def test_it_has_the_whole_corpus() -> None:
    found = sorted(str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*") if p.is_file() and p.name != "LICENSE")
    assert found == sorted(c.path for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: Path(c.path).name[:32])
def test_it_imports_the_corpus_transcript(case: Expected) -> None:
    path = corpus_file(case.path)
    transcript = load(case.path)

    assert detect_transcript_format(path) == case.format
    assert transcript.format == case.format
    assert transcript.source_path == str(path)
    assert len(transcript.messages) == case.messages
    assert comparable_count(transcript) == case.readme_msgs
    assert sum(len(m.tool_uses) for m in transcript.messages) == case.tool_calls
    assert len(transcript.warnings) == case.warnings, transcript.warnings
    for message in transcript.messages:
        assert isinstance(message.metadata["source_index"], int), message.id
        assert message.metadata["source_format"] == case.format
        assert message.timestamp.endswith("Z") and message.timestamp[4] == "-", message.timestamp
    check_sequence(transcript.messages, allow_pending_tail=False)


@pytest.mark.parametrize("case", CASES, ids=lambda c: Path(c.path).name[:32])
def test_it_gives_the_same_ids_every_time(case: Expected) -> None:
    again = load_transcript(corpus_file(case.path))
    assert [m.id for m in again.messages] == [m.id for m in load(case.path).messages]


def all_text(transcript: Transcript) -> str:
    return "\n".join(m.plain_text() for m in transcript.messages)


def test_it_keeps_the_chinese_sessions_text() -> None:
    football = load("deer-flow/demo-threads/5aa47db1-d0cb-4eb9-aea5-3dac1b371c5a/thread.json")
    assert football.messages[0].plain_text() == "为苏超联赛第一季做一个酷炫的足球网站吧！"
    # The final answer exists only as reasoning: it must survive as thinking.
    last = football.messages[-1]
    assert last.role == "assistant" and last.content[0].type == "thinking" and last.plain_text()

    delivery = load("deer-flow/v1-replay/china-food-delivery.txt")
    assert delivery.messages[0].plain_text() == "如何看待外卖大战"
    assert "京东和美团的外卖大战分析" in delivery.messages[-1].plain_text()

    reme = load("reme/cookbook-simple_demo-messages.jsonl")
    assert "小米公司正式成立于2010年4月" in all_text(reme)


def test_it_merges_claude_code_lines_of_one_response() -> None:
    transcript = load("marot-spotter/fa812bfe-b295-4cca-9c2f-fdf01028cb46.jsonl")
    first = next(m for m in transcript.messages if m.role == "assistant")

    assert first.id == "msg_01UrKfNek7w5v65j7gdsNvzn"
    assert first.metadata["source_index"] == 7
    assert first.metadata["source_indices"] == [7, 8, 9, 14]
    assert [b.type for b in first.content] == ["text", "thinking", "tool_use", "tool_use"]
    assert sum(1 for m in transcript.messages if len(m.tool_uses) > 1) == 31  # parallel-call turns
    assert transcript.system_prompt is None
    assert transcript.metadata["skipped_records"]["progress"] == 1332


@pytest.mark.parametrize(
    ("relative", "trigger", "pre_tokens"),
    [
        ("marot-spotter/fa812bfe-b295-4cca-9c2f-fdf01028cb46.jsonl", "auto", 167117),
        ("marot-spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl", "manual", 142431),
    ],
)
def test_it_keeps_claude_code_compaction(relative: str, trigger: str, pre_tokens: int) -> None:
    messages = load(relative).messages
    at = next(i for i, m in enumerate(messages) if m.metadata.get("compact_boundary"))

    boundary, summary = messages[at], messages[at + 1]
    assert boundary.role == "system"
    assert boundary.metadata["compact_trigger"] == trigger
    assert boundary.metadata["compact_pre_tokens"] == pre_tokens
    assert summary.role == "user" and summary.metadata["compact_summary"] is True
    assert summary.plain_text().startswith("This session is being continued from a previous conversation")


def test_it_rebuilds_openhands_messages() -> None:
    transcript = load("openhands/multi_swe_bench_output.ponylang__ponyc-4588.jsonl")
    assert transcript.system_prompt is not None
    assert transcript.system_prompt.startswith("You are OpenHands agent")
    assert {t["function"]["name"] for t in transcript.metadata["tools"]} >= {"execute_bash", "str_replace_editor"}

    first_run = next(m for m in transcript.messages if m.role == "tool")
    # The model saw the shell's suffix after the output.
    assert first_run.plain_text().endswith("\n[The command completed with exit code 0.]")
    error = next(m for m in transcript.messages if m.metadata.get("observation") == "error")
    assert error.role == "user"
    assert error.plain_text().startswith("Parameter 'command' is expected to be one of")


def test_it_moves_a_result_stored_after_a_later_message() -> None:
    transcript = load("deer-flow/demo-threads/b83fbb2a-4e36-4d82-9de0-7b2a02c2092a/thread.json")
    at = next(i for i, m in enumerate(transcript.messages) if any(u.id == "write_todos:14" for u in m.tool_uses))

    assert transcript.messages[at + 1].tool_results[0].id == "write_todos:14"
    assert transcript.messages[at + 1].metadata["source_index"] == 22
    assert "write_todos:14" in transcript.warnings[0]


def test_it_answers_the_deerflow_handoff_with_a_synthetic_result() -> None:
    transcript = load("deer-flow/v1-replay/china-food-delivery.txt")
    handoff = transcript.messages[1]
    synthetic = transcript.messages[2]

    assert handoff.metadata["agent"] == "coordinator" and handoff.tool_uses[0].name == "handoff_to_planner"
    assert handoff.tool_uses[0].input == {"task_title": "如何看待外卖大战", "locale": "zh-CN"}
    result = synthetic.tool_results[0]
    assert (result.id, result.is_error, result.output) == (handoff.tool_uses[0].id, True, NO_RESULT_TEXT)
    assert synthetic.metadata["synthetic"] is True
    assert "no recorded result" in transcript.warnings[0]
    assert {m.metadata.get("agent") for m in transcript.messages} >= {"planner", "researcher", "reporter"}


def test_it_renames_reused_call_ids() -> None:
    transcript = load("tau-bench/gpt-4o-airline.idx52.task2.trial1.json")
    ids = [u.id for m in transcript.messages for u in m.tool_uses]

    assert len(ids) == len(set(ids))
    assert "call_lnzJf0iU69PFY0FxSmJh6D7a#2" in ids
    assert transcript.metadata["reward"] == 0.0
    assert transcript.system_prompt is not None and transcript.system_prompt.startswith("# Airline Agent Policy")


def test_it_reads_reme_flat_tool_calls_and_times() -> None:
    transcript = load("reme/cookbook-simple_demo-messages.jsonl")
    parallel = transcript.messages[1]

    assert [u.name for u in parallel.tool_uses] == ["web_search"] * 3
    assert parallel.tool_uses[0].input == {"query": "Xiaomi Corporation company overview"}
    assert transcript.messages[2].timestamp == "2025-08-31T15:41:34.000Z"
    assert transcript.messages[2].metadata["reme"]["time_created"] == "2025-08-31 15:41:34"


def test_it_imports_the_large_claude_code_session_quickly() -> None:
    path = corpus_file("marot-spotter/fa812bfe-b295-4cca-9c2f-fdf01028cb46.jsonl")
    started = time.perf_counter()
    load_transcript(path)
    assert time.perf_counter() - started < 2.0


def test_it_detects_the_format_by_content_not_extension(tmp_path: Path) -> None:
    copy = tmp_path / "trajectory.log"
    shutil.copy(corpus_file("tau-bench/gpt-4o-airline.idx52.task2.trial1.json"), copy)
    assert detect_transcript_format(copy) == "tau_bench"


# -- other message lists ------------------------------------------------------------------


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n", encoding="utf-8")
    return path


def test_it_imports_a_copaw_dialog_archive(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "2026-03-19.jsonl", [
        {"id": "a", "name": "user", "role": "user", "content": "ls", "metadata": {},
         "timestamp": "2026-03-19 10:00:00.000"},
        {"id": "b", "name": "Friday", "role": "assistant", "content": [
            {"type": "tool_use", "id": "c1", "name": "shell", "input": {"cmd": "ls"}}], "metadata": {},
         "timestamp": "2026-03-19 10:00:01.000"},
        {"id": "c", "name": "system", "role": "system", "content": [
            {"type": "tool_result", "id": "c1", "name": "shell", "output": "a.txt"}], "metadata": {},
         "timestamp": "2026-03-19 10:00:02.000"},
    ])
    transcript = load_transcript(path)

    assert transcript.format == "agentscope_messages"
    assert [m.role for m in transcript.messages] == ["user", "assistant", "tool"]
    assert [m.metadata["source_index"] for m in transcript.messages] == [0, 1, 2]
    assert transcript.messages[2].timestamp == "2026-03-19T10:00:02.000Z"


def test_it_repairs_an_openai_list(tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps([
        {"role": "system", "content": "be nice"},
        {"role": "tool", "tool_call_id": "ghost", "content": "who asked?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "user", "content": "hello?"},
    ]), encoding="utf-8")
    transcript = load_transcript(path)

    assert transcript.format == "openai_messages"
    assert transcript.system_prompt == "be nice"
    orphan, call, synthetic, user = transcript.messages
    assert orphan.role == "user" and orphan.metadata["orphan_tool_result"] is True
    assert orphan.plain_text() == "who asked?"
    assert synthetic.metadata["synthetic"] is True and synthetic.tool_results[0].id == "c1"
    assert user.plain_text() == "hello?"
    assert len(transcript.warnings) == 2
    check_sequence(transcript.messages, allow_pending_tail=False)


def test_it_suffixes_duplicate_message_ids(tmp_path: Path) -> None:
    record = {"id": "same", "name": "user", "role": "user", "content": "hi", "metadata": {},
              "timestamp": "2026-03-19 10:00:00.000"}
    transcript = load_transcript(write_jsonl(tmp_path / "d.jsonl", [record, record]))

    assert [m.id for m in transcript.messages] == ["same", "same#dup2"]
    assert "duplicate message id" in transcript.warnings[0]


# -- bad files ------------------------------------------------------------------------------


def test_it_rejects_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"traj": "caf\xe9"}')
    with pytest.raises(MalformedInput) as info:
        load_transcript(path)
    assert info.value.message == "not valid UTF-8 at byte 13"  # 0-based offset of \xe9
    assert info.value.field == "file"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"traj": [1, 2,]}', "line 1, column 16"),
        ('{\n  "traj": [\n    {"role": "user" "content": "x"}\n  ]\n}', "line 3, column 21"),
        ("[{]", "line 1, column 3"),
    ],
)
def test_it_rejects_invalid_json_naming_line_and_column(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(MalformedInput) as info:
        load_transcript(path)
    assert where in info.value.message
    assert info.value.field == "file"


def test_it_names_the_bad_line_of_a_jsonl_file(tmp_path: Path) -> None:
    path = tmp_path / "session.jsonl"
    path.write_text('{"type": "user"}\n{"type": "user"}\n{"type": broken}\n', encoding="utf-8")
    with pytest.raises(MalformedInput) as info:
        load_transcript(path)
    assert "line 3, column 10" in info.value.message


@pytest.mark.parametrize("depth", [201, 100_000])
def test_it_rejects_json_nested_too_deeply(tmp_path: Path, depth: int) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"traj": ' + "[" * depth + "]" * depth + "}", encoding="utf-8")
    with pytest.raises(MalformedInput) as info:
        load_transcript(path)
    assert "nested deeper than 200 levels" in info.value.message


def test_it_accepts_nesting_up_to_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "deep-ok.json"
    # 200 levels, brackets inside strings do not count.
    path.write_text('{"x": "[[[[[[", "y": ' + "[" * 199 + "]" * 199 + "}", encoding="utf-8")
    with pytest.raises(UnknownFormat):  # parsed fine, just not a transcript
        load_transcript(path)


@pytest.mark.parametrize(
    "text",
    ['{"hello": "world"}', "[1, 2, 3]", "event: ping\ndata: {}\n\n", '{"a": 1}\n{"b": 2}\n', "a,b\n1,2\n"],
)
def test_it_names_the_known_formats_for_an_unknown_one(tmp_path: Path, text: str) -> None:
    path = tmp_path / "mystery.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UnknownFormat) as info:
        detect_transcript_format(path)
    for fmt in KNOWN_FORMATS:
        assert fmt in info.value.message


def test_it_rejects_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(MalformedInput):
        load_transcript(path)


def test_it_names_an_unknown_role(tmp_path: Path) -> None:
    path = tmp_path / "reme.json"
    path.write_text(json.dumps([
        {"role": "user", "content": "hi", "time_created": "2025-08-31 15:41:22"},
        {"role": "robot", "content": "beep", "time_created": "2025-08-31 15:41:23"},
    ]), encoding="utf-8")
    with pytest.raises(InvalidMessages) as info:
        load_transcript(path)
    assert info.value.field == "messages[1].role"


def test_it_names_an_unknown_langgraph_message_type(tmp_path: Path) -> None:
    path = tmp_path / "thread.json"
    path.write_text(json.dumps({"values": {"messages": [
        {"type": "human", "content": "hi"}, {"type": "ai", "content": "yo"}, {"type": "robot", "content": "?"},
    ]}}), encoding="utf-8")
    with pytest.raises(InvalidMessages) as info:
        load_transcript(path)
    assert info.value.field == "values.messages[2].type"


def test_it_reads_a_one_line_claude_code_session(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "s.jsonl", [
        {"type": "user", "uuid": "u1", "sessionId": "s", "timestamp": "2026-02-12T15:43:07.997Z",
         "message": {"role": "user", "content": "hi"}},
    ])
    transcript = load_transcript(path)
    assert transcript.format == "claude_code"
    assert [(m.id, m.plain_text()) for m in transcript.messages] == [("u1", "hi")]


def test_it_imports_the_first_of_several_tau_bench_runs(tmp_path: Path) -> None:
    run = json.loads(corpus_file("tau-bench/gpt-4o-airline.idx52.task2.trial1.json").read_text("utf-8"))
    path = tmp_path / "historical.json"
    path.write_text(json.dumps([run, run]), encoding="utf-8")
    transcript = load_transcript(path)
    assert transcript.format == "tau_bench"
    assert transcript.warnings[0] == "the file holds 2 trajectories; imported the first"


def test_it_keeps_unusual_line_separators_inside_sse_data(tmp_path: Path) -> None:
    path = tmp_path / "stream.txt"
    chunk = {"thread_id": "t", "id": "run-1", "role": "user", "content": "a\u2028b"}
    path.write_text("event: message_chunk\ndata: " + json.dumps(chunk, ensure_ascii=False) + "\n\n", encoding="utf-8")
    transcript = load_transcript(path)
    assert transcript.messages[0].plain_text() == "a\u2028b"


def test_it_answers_a_cut_off_call(tmp_path: Path) -> None:
    path = tmp_path / "thread.json"
    path.write_text(json.dumps({"values": {"messages": [
        {"type": "human", "content": "deploy", "id": "h1"},
        {"type": "ai", "content": "", "id": "a1", "tool_calls": [{"name": "deploy", "args": {}, "id": "d1"}]},
    ]}}), encoding="utf-8")
    transcript = load_transcript(path)

    last = transcript.messages[-1]
    assert last.metadata["synthetic"] is True
    assert last.tool_results[0].is_error is True
    assert last.metadata["source_index"] == 1


def test_it_imports_contextlabs_own_message_form_exactly(tmp_path) -> None:
    from contextlab.engine.importers import detect_transcript_format

    source = load_transcript(corpus_file("tau-bench/gpt-4o-airline.idx52.task2.trial1.json"))
    path = tmp_path / "ours.json"
    path.write_text(json.dumps([m.to_dict() for m in source.messages]), encoding="utf-8")
    assert detect_transcript_format(path) == "contextlab_messages"
    again = load_transcript(path)
    assert [m.id for m in again.messages] == [m.id for m in source.messages]
    assert [m.to_dict()["content"] for m in again.messages] == [m.to_dict()["content"] for m in source.messages]


def test_it_keeps_a_deerflow_interrupt_as_a_message(tmp_path: Path) -> None:
    path = tmp_path / "stream.txt"
    events = [
        ("message_chunk", {"id": "run-1", "agent": "planner", "role": "assistant", "content": "Plan: three steps"}),
        ("interrupt", {"thread_id": "t", "id": "human_feedback:1", "role": "assistant",
                       "content": "Please Review the Plan.", "finish_reason": "interrupt",
                       "options": [{"text": "Edit plan", "value": "edit_plan"}]}),
        ("progress_note", {"id": "note-1", "content": "Research started"}),
        ("heartbeat", {"id": "hb"}),
    ]
    path.write_text("".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events),
                    encoding="utf-8")

    transcript = load_transcript(path)

    texts = [m.plain_text() for m in transcript.messages]
    assert texts == ["Plan: three steps", "Please Review the Plan.", "Research started"]
    interrupt = transcript.messages[1]
    assert interrupt.role == "assistant" and interrupt.metadata["sse_event"] == "interrupt"
    assert interrupt.metadata["options"][0]["value"] == "edit_plan"
    assert any("'progress_note'" in w and "kept" in w for w in transcript.warnings)
    assert transcript.metadata["skipped_records"] == {"heartbeat": 1}


def test_it_marks_the_placeholder_result_as_a_repair() -> None:
    transcript = load("deer-flow/v1-replay/china-food-delivery.txt")

    repairs = [m for m in transcript.messages if m.is_repair]

    assert [m.tool_results[0].output for m in repairs] == [NO_RESULT_TEXT]
    assert not any(m.is_repair for m in load("tau-bench/gpt-4o-airline.idx52.task2.trial1.json").messages)


@pytest.mark.parametrize("text", ["[]", "{}", " [ ] \n"])
def test_it_says_an_empty_document_holds_no_messages(tmp_path: Path, text: str) -> None:
    path = tmp_path / "empty.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(MalformedInput, match="no messages"):
        load_transcript(path)
