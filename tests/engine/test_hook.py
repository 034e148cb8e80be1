from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from contextlab.engine.compactors.openai_compat import OpenAICompactor
from contextlab.engine.errors import InvalidMessages, MalformedInput
from contextlab.engine.hook import ContextManager
from contextlab.engine.messages import Message, ToolResultBlock
from contextlab.engine.profile import Profile
from contextlab.engine.truncation import MARKER
from tests.engine.sessions import assistant, log_lines, tool_round, user

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


def test_it_keeps_the_previous_summary_and_messages_when_the_llm_fails(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CONTEXTLAB_TEST_KEY", "test-key")
    class Broken(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": "no headings here"}}]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    compactor = OpenAICompactor(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", model="m",
                                api_key_env="CONTEXTLAB_TEST_KEY", retries=0, timeout=5)
    profile = SMALL.replace(max_input_length=200_000, compact_ratio=0.1, reserve_ratio=0.01)
    m = manager(tmp_path, profile, compactor=compactor)
    m.summary = "## Goal\nkeep me"
    for i in range(6):
        m.append([user(f"q{i} " + "word " * 2000), assistant(f"a{i} " + "word " * 2000)])
    before = m.live_ids()
    turn = m.prepare()
    assert turn.trace.outcome == "compaction_failed"
    assert m.summary == "## Goal\nkeep me"
    assert m.live_ids() == before
    assert any(f["name"] == "failed_summary_drops_messages" for f in turn.trace.flaws_avoided)
    assert list(m.workspace.glob("compact_invalid_*.json"))
    server.shutdown()


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
    for i in range(8):
        m.append([user(f"q{i}"), *tool_round("bash", {"command": str(i)}, [log_lines(40)]), assistant("ok")])
        m.prepare()
    state = json.loads(json.dumps(m.export_state()))
    again = ContextManager.from_state(SMALL, m.workspace, state)
    assert again.live_ids() == m.live_ids() and again.summary == m.summary
    assert again._live_tokens == m._live_tokens
    again.append([user("next")])
    assert again.prepare().trace.turn == m.turn + 1


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
