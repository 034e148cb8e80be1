"""An agent's own compaction adopted by the engine: one session goes on from what the agent sent."""

from __future__ import annotations

import json

from contextlab.engine.core.messages import Message, TextBlock, ToolUseBlock
from contextlab.engine.core.profile import Profile
from contextlab.engine.hook import AgentCompaction, ContextManager
from tests.engine.sessions import assistant, tool_round, user

PROFILE = Profile(max_input_length=50_000)
SUMMARY = "Summary: the user asked for the build log; src/build/main.c failed at line 42."


def _session(tmp_path) -> ContextManager:
    m = ContextManager(PROFILE, tmp_path / "ws", system_prompt="You are a build assistant.")
    m.append([user("build it"), *tool_round("bash", {"command": "make -C src/build"}, ["main.c:42: error"]),
              assistant("The build failed in src/build/main.c; see /var/log/deploy-7731.log too.")])
    m.prepare()
    return m


def test_it_replaces_the_live_context_with_what_the_agent_sent(tmp_path) -> None:
    m = _session(tmp_path)
    replaced = [msg.id for msg in m.messages]
    sent = [user(SUMMARY), user("now fix it")]
    turn = m.adopt_agent_compaction(sent, AgentCompaction(agent="Claude Code", kind="its summary", summary=SUMMARY))

    assert turn.trace.trigger == "agent" and turn.trace.outcome == "compacted"
    assert [msg.id for msg in m.messages] == [msg.id for msg in sent]
    # The payload is the system prompt and the agent's messages: no summary of the engine's on top.
    assert [msg.role for msg in turn.payload] == ["system", "user", "user"]
    assert turn.payload[1].plain_text() == SUMMARY and m.summary_message() is None
    # Every replaced message went to the archive as a compaction of that agent, its summary recorded.
    for mid in replaced:
        assert m.fate[mid][-1]["event"] == "compacted" and m.fate[mid][-1]["summary_version"] == 1
    assert (m.summaries[-1].trigger, m.summaries[-1].compactor, m.summaries[-1].text) == ("agent", "Claude Code",
                                                                                          SUMMARY)
    archived = [json.loads(line) for f in (m.workspace / "dialog").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert {entry["id"] for entry in archived} >= set(replaced)
    step = turn.trace.get("agent_compaction")
    assert step is not None and step.status == "fired"
    assert step.numbers["replaced"] == len(replaced) == 4 and step.numbers["sent"] == 2
    assert step.details["replaced_ids"] == replaced and step.details["summary"] == SUMMARY
    # The summary names the source file, not the log file: that one is lost, and said so.
    assert "/var/log/deploy-7731.log" in step.details["lost_identifiers"]
    assert "src/build/main.c" not in step.details["lost_identifiers"]


def test_it_goes_on_as_the_same_session_after_the_agent_compaction(tmp_path) -> None:
    m = _session(tmp_path)
    m.adopt_agent_compaction([user(SUMMARY)], AgentCompaction(agent="Codex", kind="local compaction",
                                                               summary=SUMMARY))
    # Saved and loaded as the service does between calls: the next turn continues the same numbering.
    again = ContextManager.from_state(PROFILE, tmp_path / "ws", m.export_state())
    again.append([user("and the tests?")])
    turn = again.prepare()
    assert turn.trace.turn == 3 and turn.trace.outcome == "no_action"
    assert [msg.plain_text() for msg in turn.payload[1:]] == [SUMMARY, "and the tests?"]
    assert again.summary_version == 1 and again.summary_message() is None


def test_it_takes_a_kept_tool_call_the_agent_sends_again(tmp_path) -> None:
    """A call the agent keeps verbatim after its compaction is the same call, not a duplicate id."""
    m = _session(tmp_path)
    call = next(msg for msg in m.messages if msg.tool_uses)
    result = next(msg for msg in m.messages if msg.tool_results)
    kept = [user(SUMMARY),
            Message(role="assistant", content=(TextBlock("again"), ToolUseBlock(call.tool_uses[0].id, "bash", {})),
                    id="kept-call"),
            Message(role="tool", content=result.content, id="kept-result")]
    m.adopt_agent_compaction(kept, AgentCompaction(agent="Codex", kind="local compaction", summary=SUMMARY))
    assert [msg.id for msg in m.messages][1:] == ["kept-call", "kept-result"]


def test_it_records_an_opaque_summary_as_opaque(tmp_path) -> None:
    m = _session(tmp_path)
    marker = "[compaction summary, encrypted by the provider: opaque to ContextLab; 12 characters]"
    turn = m.adopt_agent_compaction([user(marker)], AgentCompaction(agent="Codex", kind="remote compaction",
                                                                     summary=marker, opaque=True))
    step = turn.trace.get("agent_compaction")
    assert step is not None and step.details["opaque"] is True
    assert "opaque" in step.outcome and m.summaries[-1].text == marker
