"""The real Claude Code CLI through ContextLab, against a scripted Anthropic upstream.

The agent is real (it plans nothing here: the scripted model decides), runs the
tools the model asks for (Bash ``ls``, Read of a file) and sends their results
back; ContextLab is served for real over HTTP; only the model is scripted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from contextlab.gateway import managed_messages
from contextlab.gateway.models import GatewayExchange, ObservedCall, UpstreamProvider
from contextlab.gateway.protocols import anthropic_messages
from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, AgentSession
from contextlab.support import providers
from tests.gateway.agents.claude_code import run_claude
from tests.gateway.anthropic_provider import (
    Answer,
    AnthropicProvider,
    last_tool_results,
    last_user_text,
    text,
    tool_use,
)

STORED_KEY = "sk-ant-stored-upstream-key"
SECRET = "the secret word is plum"
SUMMARY = "The user had me list the files (notes.txt) and read notes.txt, which says the secret word is plum."


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def brain(project: Path):
    """The scripted model: list, read, summarise when Claude Code compacts, answer from the summary."""
    calls = iter(range(1, 100))

    def answer(body: dict[str, Any]) -> Answer:
        results = last_tool_results(body)
        prompt = last_user_text(body)
        if "detailed summary of the conversation" in prompt:
            return text(f"<analysis>two tool calls</analysis>\n<summary>{SUMMARY}</summary>")
        if results:
            return text("Tool output: " + " | ".join(_result_text(r)[:200] for r in results))
        if prompt.endswith("list the files"):
            return tool_use("Bash", {"command": "ls", "description": "List files"}, f"toolu_ls{next(calls):02d}")
        if prompt.endswith("read notes.txt"):
            return tool_use("Read", {"file_path": str(project / "notes.txt")}, f"toolu_read{next(calls):02d}")
        return text("From the summary: the secret word is plum.")

    return answer


@pytest.fixture
def anthropic_upstream() -> Iterator[AnthropicProvider]:
    with AnthropicProvider() as provider:
        yield provider


def _profile(alice: User, anthropic_upstream: AnthropicProvider, mode: str) -> AgentProfile:
    # Claude Code's system prompt and tools alone are ~20k tokens: a real window.
    profile = services.profile_create(owner=alice, name="claude", knobs={"max_input_length": 200_000})
    UpstreamProvider.objects.create(profile=profile, base_url=anthropic_upstream.base_url, kind="anthropic",
                                    mode=mode, api_key=providers.encrypt_secret(STORED_KEY), timeout=60)
    return profile


def _session_run(tmp_path: Path, gateway_server: str, token: str) -> list[Any]:
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text(SECRET + "\n")
    home = tmp_path / "home"
    env = {"ANTHROPIC_API_KEY": token}
    runs = [run_claude("list the files", cwd=project, home=home, base_url=gateway_server, env=env)]
    for prompt in ("read notes.txt", "/compact", "what is the secret word?"):
        runs.append(run_claude(prompt, cwd=project, home=home, base_url=gateway_server, env=env, cont=True))
    return runs


def _tool_pairs(received: list[Any]) -> dict[str, str]:
    """Each tool_use id the scripted model asked for → the text of the tool_result the CLI sent back."""
    pairs: dict[str, str] = {}
    for request in received:
        for message in request.body["messages"]:
            if message["role"] == "user" and isinstance(message["content"], list):
                for block in message["content"]:
                    if block.get("type") == "tool_result":
                        pairs[block["tool_use_id"]] = _result_text(block)
    return pairs


def _check_cli_session(runs: list[Any], upstream: AnthropicProvider) -> None:
    assert [run.returncode for run in runs] == [0, 0, 0, 0], [run.stderr[-2000:] for run in runs]
    assert runs[0].result["result"].startswith("Tool output: notes.txt")
    assert SECRET in runs[1].result["result"]
    assert runs[3].result["result"] == "From the summary: the secret word is plum."
    requests = upstream.messages_requests
    assert len(requests) == 6
    # The agent really ran the tools, and their results reached the model paired with the calls.
    pairs = _tool_pairs(requests)
    assert set(pairs) == {"toolu_ls01", "toolu_read02"}
    assert pairs["toolu_ls01"].startswith("notes.txt")
    assert SECRET in pairs["toolu_read02"]
    # The stored key went upstream, never the ContextLab token; Claude Code's protocol headers went as sent.
    for request in requests:
        assert request.headers["x-api-key"] == STORED_KEY
        assert "authorization" not in {k.lower() for k in request.headers}
        assert request.headers["anthropic-version"] == "2023-06-01"
        assert "claude-code-20250219" in request.headers["anthropic-beta"]
        assert request.path == "/v1/messages?beta=true"
    # The fifth call is Claude Code's compaction; the sixth continues from its summary.
    assert anthropic_messages.is_compaction_request(requests[4].body)
    assert SUMMARY in anthropic_messages.compaction_summary(requests[5].body)
    assert not any(anthropic_messages.is_compaction_request(r.body) for r in requests[:4] + requests[5:])


def _check_context_edits(turns: list[Any]) -> None:
    """Claude Code asks Anthropic for server-side context editing on every call: each turn says so."""
    for turn in turns:
        step = next(s for s in turn.trace["steps"] if s["step"] == "provider_context_edits")
        assert [e["type"] for e in step["details"]["asked"]] == ["clear_thinking_20251015"]
        assert step["details"]["applied"] == [] and step["status"] == "ok"


def test_it_observes_a_real_claude_code_session(tmp_path, gateway_server, alice, alice_token, anthropic_upstream):
    _profile(alice, anthropic_upstream, "observe")
    anthropic_upstream.brain = brain(tmp_path / "project")
    runs = _session_run(tmp_path, gateway_server, alice_token)
    _check_cli_session(runs, anthropic_upstream)

    calls = list(ObservedCall.objects.order_by("pk"))
    assert [(c.status_code, c.error, c.endpoint) for c in calls] == [(200, "", "anthropic.messages")] * 6
    # Forwarded unchanged: the provider got exactly the request the agent sent.
    assert [c.body for c in calls] == [r.body for r in anthropic_upstream.messages_requests]
    assert calls[0].usage == {"input_tokens": 1200, "cache_read_input_tokens": 800,
                              "cache_creation_input_tokens": 100, "output_tokens": 25}
    # One conversation, named by Claude Code's session id, through its own compaction.
    assert len({c.session_header for c in calls}) == 1 and calls[0].session_header == runs[0].result["session_id"]
    session = AgentSession.objects.get()
    assert {c.session_id for c in calls} == {session.pk}
    assert session.title == "list the files"
    turns = list(session.turns.order_by("number"))
    assert len(turns) == 6
    assert [t.trace["outcome"] for t in turns] == ["no_action"] * 5 + ["compacted"]
    summary_step = next(s for s in turns[5].trace["steps"] if s["step"] == "summary")
    assert summary_step["status"] == "fired"
    _check_context_edits(turns)
    messages = list(session.messages.order_by("seq"))
    called = [block["id"] for m in messages for block in m.content if block.get("type") == "tool_use"]
    answered = [block["id"] for m in messages for block in m.content if block.get("type") == "tool_result"]
    assert called == answered == ["toolu_ls01", "toolu_read02"]


def test_it_manages_a_real_claude_code_session(tmp_path, gateway_server, alice, alice_token, anthropic_upstream):
    _profile(alice, anthropic_upstream, "manage")
    anthropic_upstream.brain = brain(tmp_path / "project")
    runs = _session_run(tmp_path, gateway_server, alice_token)
    _check_cli_session(runs, anthropic_upstream)

    exchanges = list(GatewayExchange.objects.order_by("created"))
    assert [(e.endpoint, e.status_code, e.managed) for e in exchanges] == \
        [("anthropic.messages", 200, True)] * 4 + [("anthropic.messages", 200, False), ("anthropic.messages", 200, True)]
    assert [e.error for e in exchanges[:4]] == [""] * 4
    # Claude Code's compaction call goes as it came, shown in the session it compacts; the call
    # after it starts from the summary and continues that same session, its context replaced.
    assert exchanges[4].error == managed_messages.COMPACTION_REQUEST
    assert exchanges[5].error == managed_messages.AFTER_COMPACTION
    assert [e.identity for e in exchanges] == ["new", "continued", "continued", "continued", "", "compacted"]
    first = exchanges[0].session
    assert first is not None and {e.session for e in exchanges} == {first}
    assert AgentSession.objects.count() == 1
    first.refresh_from_db()
    assert first.turns_count == 5 and first.title == "gateway · list the files"
    turns = list(first.turns.order_by("number"))
    compaction = turns[4]
    assert (compaction.trigger, compaction.outcome) == ("agent", "compacted")
    step = next(s for s in compaction.trace["steps"] if s["step"] == "agent_compaction")
    assert step["details"]["agent"] == "Claude Code" and SUMMARY in step["details"]["summary"]
    # The messages of the turns before were replaced, each named.
    assert step["numbers"]["replaced"] == len(step["details"]["replaced_ids"]) > 0
    summary = first.summary_versions.get()
    assert (summary.trigger, summary.compactor, summary.turn) == ("agent", "Claude Code", 5)
    assert SUMMARY in summary.text
    # What went upstream after the compaction is what Claude Code sent, not the replaced history.
    sent = anthropic_messages_sent(anthropic_upstream)[5]
    assert SUMMARY in json.dumps(sent) and "toolu_ls01" not in json.dumps(sent)
    assert compaction.payload_tokens > 0 and SUMMARY in json.dumps(compaction.payload)
    messages = list(first.messages.order_by("seq"))
    called = [block["id"] for m in messages for block in m.content if block.get("type") == "tool_use"]
    answered = [block["id"] for m in messages for block in m.content if block.get("type") == "tool_result"]
    assert called == answered == ["toolu_ls01", "toolu_read02"]
    # What went upstream is the agent's conversation block for block: cache marks kept.
    last_before_compaction = anthropic_messages_sent(anthropic_upstream)[3]
    assert last_before_compaction[-1]["content"][-1]["type"] == "tool_result"
    assert last_before_compaction[-1]["content"][-1].get("cache_control") == {"type": "ephemeral"}
    _check_context_edits(list(first.turns.order_by("number")))
    # Every turn kept the provider's usage.
    usage = first.turns.order_by("number").first().usage
    assert usage["input_tokens"] == 1200 and usage["cache_read_input_tokens"] == 800


def anthropic_messages_sent(upstream: AnthropicProvider) -> list[list[dict[str, Any]]]:
    return [r.body["messages"] for r in upstream.messages_requests]
