from __future__ import annotations

import json

import pytest

from contextlab.engine.compactors.openai_compat import OpenAICompactor
from contextlab.engine.core.errors import InvalidMessages, MalformedInput
from contextlab.engine.core.messages import Message, ToolResultBlock
from contextlab.engine.core.profile import Profile
from contextlab.engine.hook import ContextManager
from contextlab.engine.stages.truncation import MARKER
from tests.engine.sessions import assistant, log_lines, tool_round, user
from tests.fakellm import FakeLLM, Reply, Sleep, Status

SMALL = Profile(max_input_length=4_000, recent_n=2, recent_max_bytes=6_000, old_max_bytes=600,
                markdown_recent_max_bytes=8_000, markdown_old_max_bytes=2_000)


def manager(tmp_path, profile: Profile = SMALL, **kwargs) -> ContextManager:
    return ContextManager(profile, tmp_path / "ws", system_prompt="You are a build assistant.", **kwargs)


def test_it_does_nothing_under_the_threshold_and_says_so(tmp_path) -> None:
    m = manager(tmp_path)
    m.append([user("hello")])
    turn = m.prepare()
    assert turn.trace.outcome == "no_action"
    assert [s.step for s in turn.trace.steps] == ["gate", "tool_result_compaction", "context_check", "result"]
    check = turn.trace.get("context_check")
    assert check is not None and "keep everything" in check.outcome
    assert [msg.role for msg in turn.payload] == ["system", "user"]


def test_it_cuts_a_large_result_when_it_enters_and_keeps_the_original(tmp_path) -> None:
    m = manager(tmp_path)
    big = log_lines(400)
    stored = m.append([user("build it"), *tool_round("bash", {"command": "make"}, [big])])
    result = stored[-1]
    text = result.tool_results[0].output_text()
    assert MARKER in text and len(text.encode()) < 6_000 + 600
    entry = result.metadata["offload"]["0"]
    assert (m.workspace / entry["file"]).read_text() == big
    assert m.fate[result.id][-1]["stage"] == 1


def test_it_recuts_results_that_slide_out_of_recent_n(tmp_path) -> None:
    m = manager(tmp_path)
    m.append([user("go"), *tool_round("bash", {"command": "a"}, [log_lines(60, "a")])])
    first_id = m.messages[-1].id
    for tag in ("b", "c"):
        m.append([*tool_round("bash", {"command": tag}, [log_lines(60, tag)])])
    turn = m.prepare()
    step = turn.trace.get("tool_result_compaction")
    assert step is not None and step.numbers["stage2_count"] == 1
    first = next(msg for msg in m.messages if msg.id == first_id)
    assert first.metadata["offload"]["0"]["stage"] == 2
    assert len(first.tool_results[0].output_text().encode()) < 600 + 700
    # The same file, never a second copy.
    assert len(list((m.workspace / "tool_result").glob("*.txt"))) == 1


def test_it_compacts_archives_originals_and_keeps_a_contiguous_suffix(tmp_path) -> None:
    m = manager(tmp_path)
    for i in range(12):
        m.append([user(f"step {i}: please compile module {i}"),
                  *tool_round("bash", {"command": f"make m{i}"}, [log_lines(50, f"m{i}")]),
                  assistant(f"module {i} compiled")])
        m.prepare()
    outcomes = [t.outcome for t in m.traces]
    assert "compacted" in outcomes
    assert m.summary and "## Goal" in m.summary
    archived = {rec["id"]: rec for _, rec in m.archive.iter_records()}
    assert set(archived) == set(m.archived_ids)
    for rec in archived.values():
        for block in rec["content"]:
            if block["type"] == "tool_result":
                assert MARKER not in block["output"]  # originals, not excerpts
    ingested = list(m.fate)
    pinned = m.traces[-1].payload["pinned_message_ids"]
    suffix = [mid for mid in m.live_ids() if mid not in pinned]
    assert suffix == ingested[len(ingested) - len(suffix):]
    assert set(m.live_ids()) | set(archived) == set(ingested)
    assert not set(m.live_ids()) & set(archived)


VALID_SUMMARY = """## Goal
Ship the build.
## Constraints & Preferences
(none)
## Progress
### Done
- compiled
### In Progress
- (none)
### Blocked
- (none)
## Key Decisions
- (none)
## Next Steps
1. test
## Critical Context
- src/app/models.py
"""


def big_session(m: ContextManager, turns: int = 6) -> None:
    for i in range(turns):
        m.append([user(f"q{i} " + "word " * 2000), assistant(f"a{i} " + "word " * 2000)])


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ([Reply("no headings here")], "has no Markdown headings"),
        ([Reply("## Goal\nonly one section")], "missing section"),
        ([Status(500, "upstream exploded")], "500"),
        ([Sleep(3.0, Reply(VALID_SUMMARY))], "timeout"),
        ([Reply("")], "empty"),
    ],
    ids=["no-headings", "missing-sections", "http-error", "timeout", "empty"],
)
def test_it_keeps_the_previous_summary_and_messages_when_the_llm_fails(tmp_path, script, reason) -> None:
    profile = SMALL.replace(max_input_length=200_000, compact_ratio=0.1, reserve_ratio=0.01)
    with FakeLLM(script) as llm:
        compactor = OpenAICompactor(llm.base_url, "m", api_key_env=None, retries=0, timeout=1.0)
        m = manager(tmp_path, profile, compactor=compactor)
        m.summary = "## Goal\nkeep me"
        big_session(m)
        before = m.live_ids()
        turn = m.prepare()
    assert turn.trace.outcome == "compaction_failed"
    assert m.summary == "## Goal\nkeep me"
    assert m.live_ids() == before and not m.archived_ids
    failed = [s for s in turn.trace.steps if s.status == "failed"]
    assert failed and reason.lower() in " ".join(r for s in failed for r in s.reasons).lower()
    assert any(f["name"] == "failed_summary_drops_messages" for f in turn.trace.flaws_avoided)
    dumps = list(m.workspace.glob("compact_invalid_*.json"))
    assert len(dumps) == 1 and json.loads(dumps[0].read_text())["turn"] == turn.trace.turn


def test_it_falls_back_to_an_extractive_summary_only_when_the_window_would_overflow(tmp_path) -> None:
    # The window is too small to keep everything, so a failed LLM must not leave it overflowing.
    profile = SMALL.replace(max_input_length=20_000, compact_ratio=0.5, reserve_ratio=0.05)
    with FakeLLM([Status(503)]) as llm:
        m = manager(tmp_path, profile,
                    compactor=OpenAICompactor(llm.base_url, "m", api_key_env=None, retries=1, timeout=2.0,
                                              retry_backoff=0.01))
        big_session(m, turns=6)
        turn = m.prepare()
        assert len(llm.requests) == 2  # the retry was made
    assert turn.trace.outcome == "fallback_summary"
    assert m.summary and "## Goal" in m.summary and m.summaries[-1].fallback
    assert m.summaries[-1].compactor == "extractive"


def test_it_records_usage_and_latency_of_a_real_summary_call(tmp_path) -> None:
    profile = SMALL.replace(max_input_length=200_000, compact_ratio=0.1, reserve_ratio=0.01)
    with FakeLLM([Reply(VALID_SUMMARY)]) as llm:
        m = manager(tmp_path, profile, compactor=OpenAICompactor(llm.base_url, "cheap-model", api_key_env=None))
        big_session(m)
        turn = m.prepare()
        sent = llm.requests[0]
    assert turn.trace.outcome == "compacted"
    step = turn.trace.get("summary")
    assert step is not None and step.details["usage"]["total_tokens"] == 375
    assert step.numbers["latency_ms"] >= 0 and sent.body["model"] == "cheap-model"
    assert "q0" in sent.user_text
    assert m.summary is not None and m.summary.strip() == VALID_SUMMARY.strip()


def test_it_refuses_a_100_mb_tool_output_with_the_default_profile(tmp_path) -> None:
    m = manager(tmp_path, Profile())
    call = tool_round("bash", {"command": "cat huge.log"}, ["x"])
    huge = Message(role="tool", id="t-huge",
                   content=(ToolResultBlock(id=call[0].tool_uses[0].id, name="bash", output="x" * 100_000_000),))
    with pytest.raises(MalformedInput, match="more than the 16,777,216-byte limit"):
        m.append([user("go"), call[0], huge])
    assert m.messages == [] and not (m.workspace / "tool_result").exists()


def test_it_refuses_bad_batches_without_writing_anything(tmp_path) -> None:
    m = manager(tmp_path)
    m.append([user("hi")])
    orphan = Message(role="tool", content=(ToolResultBlock(id="nope", name="bash", output="x"),), id="t-x")
    with pytest.raises(InvalidMessages, match="orphan tool result"):
        m.append([orphan])
    with pytest.raises(InvalidMessages, match="duplicate message id"):
        m.append([Message.text("user", "again", id=m.messages[0].id)])
    pending = tool_round("bash", {"c": "x"}, ["out"])[0]
    with pytest.raises(InvalidMessages, match="have no result before"):
        m.append([pending, user("moving on")])
    with pytest.raises(InvalidMessages, match="unknown role"):
        Message.from_dict({"role": "robot", "content": []})
    tiny = manager(tmp_path / "t", SMALL.replace(max_message_bytes=1_000))
    with pytest.raises(MalformedInput, match="more than the 1,000-byte limit"):
        tiny.append([user("x" * 2_000)])
    with pytest.raises(InvalidMessages, match="not valid UTF-8"):
        m.append([user("broken \udcff byte")])
    assert m.live_ids() == [m.messages[0].id] and len(m.fate) == 1


def test_it_tells_the_observer_each_step_as_it_finishes(tmp_path) -> None:
    seen: list[str] = []
    m = manager(tmp_path, observer=lambda step, turn: seen.append(step["step"]))
    m.append([user("hi")])
    m.prepare()
    assert seen == ["gate", "tool_result_compaction", "context_check", "result"]


def test_it_previews_and_runs_a_manual_compaction_with_an_instruction(tmp_path) -> None:
    m = manager(tmp_path, SMALL.replace(max_input_length=100_000))
    for i in range(5):
        m.append([user(f"question {i} about src/app/models.py"), assistant(f"answer {i}")])
    preview = m.preview_compaction()
    assert preview.compact_ids and preview.keep_ids[-1] == m.messages[-1].id
    turn = m.compact("keep every file path")
    assert turn.trace.trigger == "manual" and turn.trace.outcome == "compacted"
    assert m.live_ids() == preview.keep_ids
    summary_step = turn.trace.get("summary")
    assert summary_step is not None and summary_step.inputs["instruction"] == "keep every file path"


def test_it_round_trips_its_state(tmp_path) -> None:
    m = manager(tmp_path)
    # Outputs large enough that a compaction happens: the lean state then drops the fates of messages gone.
    for i in range(8):
        m.append([user(f"q{i}"), *tool_round("bash", {"command": str(i)}, [log_lines(60)]), assistant("ok")])
        m.prepare()
    state = json.loads(json.dumps(m.export_state()))
    again = ContextManager.from_state(SMALL, m.workspace, state)
    assert again.live_ids() == m.live_ids() and again.summary == m.summary
    assert again._live_tokens == m._live_tokens
    # Counts come back from the state instead of being re-encoded: a marked
    # count survives the restore.
    key = m.counter.key
    marked = json.loads(json.dumps(state))
    marked["messages"][0]["token_memo"][key] = 12_345
    restored = ContextManager.from_state(SMALL, m.workspace, marked)
    assert restored.tokens_of(restored.messages[0]) == 12_345
    again.append([user("next")])
    assert again.prepare().trace.turn == m.turn + 1
    lean = m.export_state(history=False)
    assert set(lean["fate"]) == set(m.live_ids()) and len(lean["fate"]) < len(state["fate"])
    slim = ContextManager.from_state(SMALL, m.workspace, json.loads(json.dumps(lean)))
    assert slim.live_ids() == m.live_ids() and slim._live_tokens == m._live_tokens


def test_it_runs_the_copaw_policy_and_names_its_losses(tmp_path) -> None:
    profile = SMALL.replace(policy="copaw")
    m = manager(tmp_path, profile)
    for i in range(30):
        m.append([user(f"step {i}"), *tool_round("bash", {"command": f"make {i}"}, ["x" * 3_000]),
                  assistant("done")])
        m.prepare()
    losses = {f["name"] for t in m.traces for f in t.copaw_losses}
    assert "silent_single_line_cut" in losses or "raw_byte_cut" in losses
    assert any(t.outcome == "compacted" for t in m.traces)


def test_it_flags_a_read_whose_file_is_written_later(tmp_path) -> None:
    m = manager(tmp_path, Profile())
    read = tool_round("read_file", {"file_path": "src/app.py"}, ["def main():\n    return 1\n"])
    write = tool_round("write_file", {"file_path": "src/app.py", "content": "def main():\n    return 2\n"}, ["ok"])
    m.append([user("fix src/app.py"), *read])
    assert not m.stale
    m.append(write)
    turn = m.prepare()
    assert m.stale[read[1].id]["written_by"] == write[0].id
    assert m.fate[read[1].id][-1]["event"] == "stale"
    stale = turn.trace.get("result")
    assert stale is not None and stale.details["stale_reads"][0]["path"] == "src/app.py"


def test_it_writes_preferences_and_lessons_to_the_daily_note_at_compaction(tmp_path) -> None:
    m = manager(tmp_path, SMALL.replace(max_input_length=100_000))
    failed = tool_round("bash", {"command": "npm install"}, ["npm ERR! code ERESOLVE\nExit code 1"])
    worked = tool_round("bash", {"command": "pnpm install"}, ["Done in 3.2s"])
    m.append([user("I prefer pnpm over npm. Please always run the linter before committing."),
              *failed, *worked, assistant("installed"), user("now run the tests"), assistant("running")])
    turn = m.compact()
    step = turn.trace.get("mark_compressed")
    assert step is not None and step.details["memory"]["file"].startswith("memory/")
    note = (m.workspace / step.details["memory"]["file"]).read_text()
    assert "pnpm" in note and "## Preferences" in note and "## Lessons" in note
    m.append([user("and again, I prefer pnpm over npm"), assistant("noted")])
    m.compact()
    again = (m.workspace / step.details["memory"]["file"]).read_text()
    assert again.count("I prefer pnpm over npm") == 1


def test_it_undoes_an_archive_write_whose_turn_was_never_saved(tmp_path) -> None:
    # A caller saves the state in its own transaction; a crash after the archive
    # write but before that save must leave neither a duplicate nor a loss.
    m = ContextManager(SMALL.replace(max_input_length=100_000), tmp_path / "ws", transactional=True)
    for i in range(4):
        m.append([user(f"q{i} about src/app/models.py"), assistant(f"a{i}")])
    saved = json.loads(json.dumps(m.export_state()))  # the last saved state
    m.compact()  # archives, then "crashes": no save, no commit
    dialog = next((m.workspace / "dialog").glob("*.jsonl"))
    assert dialog.read_text().count("\n") == len(m.archived_ids) > 0

    restarted = ContextManager.from_state(SMALL.replace(max_input_length=100_000), m.workspace, saved,
                                          transactional=True)
    assert restarted.recovered_files == [f"dialog/{dialog.name}"]
    assert dialog.read_text() == ""  # cut back to before the unsaved turn
    turn = restarted.compact()
    restarted.commit()
    ids = [json.loads(line)["id"] for line in dialog.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == len(restarted.archived_ids)
    assert turn.trace.outcome == "compacted"
    assert set(ids) | set(restarted.live_ids()) == set(m.fate)


def test_it_keeps_an_archive_write_whose_turn_was_saved(tmp_path) -> None:
    m = ContextManager(SMALL.replace(max_input_length=100_000), tmp_path / "ws", transactional=True)
    for i in range(4):
        m.append([user(f"q{i}"), assistant(f"a{i}")])
    m.compact()
    saved = json.loads(json.dumps(m.export_state()))  # saved, then a crash before commit()
    restarted = ContextManager.from_state(SMALL.replace(max_input_length=100_000), m.workspace, saved,
                                          transactional=True)
    assert restarted.recovered_files == []
    dialog = next((m.workspace / "dialog").glob("*.jsonl"))
    assert dialog.read_text().count("\n") == len(saved["archived_ids"])
    assert not restarted.archive.journal_path.exists()


def test_it_keeps_the_payload_delta_across_a_save_between_append_and_hook(tmp_path) -> None:
    m = manager(tmp_path)
    m.append([user("hello")])
    m.prepare()
    m.append([user("more")])
    state = json.loads(json.dumps(m.export_state(history=False)))
    again = ContextManager.from_state(SMALL, m.workspace, state)
    turn = again.prepare()
    assert turn.trace.payload["added_ids"] == [again.messages[-1].id]
