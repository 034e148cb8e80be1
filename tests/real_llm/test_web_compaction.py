"""The web app's compaction paths with a profile whose summary model is a real llama-server.

Auto compaction during a turn, manual compaction through the background job,
and a gateway-managed session. Each path makes one summary call; what the app
must do follows from the verdict on the reply the server actually sent: a
valid reply becomes the summary, an invalid one is saved and everything is
kept (or, for a manual compaction, replaced by the offline extractive summary).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai import OpenAI

from contextlab.engine.stages.summary.validity import check_summary, normalize_summary
from contextlab.gateway.models import UpstreamProvider
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, CompactionRun, SessionMessage
from contextlab.support import jobs
from tests.conversations import answer, log_output, tool_turn
from tests.gateway.provider import tool_loop
from tests.invariants import assert_nothing_lost
from tests.real_llm.server import Exchange, RecordingProxy

pytestmark = pytest.mark.django_db(transaction=True)

# A CPU-only server on a busy 2-core machine can take minutes for one prompt.
TIMEOUT = 300.0


def _profile(owner, llm: RecordingProxy, settings):
    # The operator offers the local server as a provider; the profile picks it by name.
    settings.CONTEXTLAB_PROVIDERS = {"local-llama": {"base_url": llm.base_url, "api_key_env": ""}}
    # A 2,000-token window: compaction fires within a few turns, and the summary
    # prompt (about 1,200 tokens of transcript) stays small for a CPU-only server.
    return services.profile_create(owner=owner, name="real-llm", knobs={
        "max_input_length": 2_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400,
        "compactor": "openai", "compaction_provider": "local-llama", "compaction_model": "smollm2",
        "compaction_timeout": TIMEOUT, "compaction_retries": 0,
        "summary_language": "en",
    })


def _step(trace: dict[str, Any], name: str) -> dict[str, Any]:
    [step] = [s for s in trace["steps"] if s["step"] == name]
    return dict(step)


def _assert_call_recorded(trace: dict[str, Any], exchange: Exchange) -> None:
    """The trace's latency and usage are those of the real call."""
    summary = _step(trace, "summary")
    assert summary["status"] == "fired"
    assert summary["numbers"]["latency_ms"] >= exchange.seconds * 1000 * 0.9
    assert exchange.usage is not None
    assert summary["details"]["usage"] == {k: exchange.usage[k]
                                           for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    assert exchange.body is not None and not exchange.body.get("stream", False)
    assert "max_tokens" not in exchange.body  # the profile sets none: the server's limit applies
    assert [m["role"] for m in exchange.body["messages"]] == ["system", "user"]


def _fell_back(trace: dict[str, Any]) -> bool:
    """Whether the turn put the extractive summary in place of an invalid reply (the window would overflow)."""
    return any("fell back to the offline extractive summary" in reason for reason in _step(trace, "validity")["reasons"])


def _saved_invalid(session: AgentSession, trace: dict[str, Any]) -> dict[str, Any]:
    validity = _step(trace, "validity")
    assert validity["status"] == "failed"
    saved: dict[str, Any] = json.loads((session.workspace / validity["details"]["saved"]).read_text(encoding="utf-8"))
    return saved


def test_it_applies_or_rejects_the_real_reply_during_a_turn(alice, llm, settings):
    session = services.session_create(owner=alice, system_prompt="You are a careful build agent.",
                                      profile=_profile(alice, llm, settings), title="Nightly build")
    trace: dict[str, Any] = {}
    for i in range(1, 16):
        services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []), *tool_turn(i)])
        live_before = list(SessionMessage.objects.filter(session=session, status="live")
                           .values_list("message_id", flat=True))
        _, trace = services.session_prepare(session=session)
        if llm.completions:
            break
    [exchange] = llm.completions
    session.refresh_from_db()
    turn = session.turns.get(number=trace["turn"])
    _assert_call_recorded(trace, exchange)
    # The reply is used when valid. When not, everything is kept, unless keeping it would overflow the
    # window (the default policy defers a compaction while the payload fits, so it may come to that):
    # then the offline extractive summary stands in, and the trace says so.
    verdict = check_summary(exchange.content, language="en")
    if verdict.valid:
        assert turn.outcome == "compacted"
        assert session.summary == normalize_summary(exchange.content or "") and session.summary_version == 1
    else:
        saved = _saved_invalid(session, trace)
        assert saved["response"] == exchange.response and saved["reason"] == "; ".join(verdict.reasons)
        if _fell_back(trace):
            assert turn.outcome == "fallback_summary"
            assert session.summary and session.summary_version == 1
        else:
            assert turn.outcome == "compaction_failed"
            assert session.summary == "" and session.summary_version == 0
            live_after = list(SessionMessage.objects.filter(session=session, status="live")
                              .values_list("message_id", flat=True))
            assert live_after == live_before
    assert_nothing_lost(session)


def test_it_runs_a_manual_compaction_job_against_the_real_server(alice, llm, settings):
    session = services.session_create(owner=alice, system_prompt="You are a careful build agent.",
                                      profile=_profile(alice, llm, settings), title="Manual")
    for i in range(1, 4):
        services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []), *tool_turn(i)])
    run = services.compaction_enqueue(session=session, instruction="Keep every path.", requested_by=alice)
    assert jobs.drain(TIMEOUT + 30)
    run.refresh_from_db()
    session.refresh_from_db()
    [exchange] = llm.completions
    assert exchange.body is not None and "Keep every path." in exchange.body["messages"][-1]["content"]
    assert run.turn_number is not None
    turn = session.turns.get(number=run.turn_number)
    _assert_call_recorded(turn.trace, exchange)
    verdict = check_summary(exchange.content, language="en")
    assert run.status == CompactionRun.Status.DONE
    if verdict.valid:
        assert run.outcome == "compacted" and run.error == ""
        # The identifier post-check only appends what the model dropped.
        assert session.summary.startswith(normalize_summary(exchange.content or "").rstrip())
    else:
        # Asked for explicitly: an invalid reply gives way to the offline summary, and the run says so.
        assert run.outcome == "fallback_summary"
        assert "summary model failed" in run.error
        version = session.summary_versions.get(version=1)
        assert version.fallback and version.compactor == "extractive"
        assert check_summary(session.summary, language="en").valid
        assert _saved_invalid(session, turn.trace)["response"] == exchange.response
    assert_nothing_lost(session)


def _agent_until_summary_call(client: OpenAI, llm: RecordingProxy, rounds: int) -> Any:
    """A tool loop through the gateway, stopped right after the call during which it asked for a summary."""
    system = {"role": "system", "content": "You are a build engineer. Keep exact paths and error lines."}
    tools: list[Any] = [{"type": "function", "function": {"name": "run_shell", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}}]
    messages: list[Any] = [system]
    for i in range(1, rounds + 1):
        messages.append({"role": "user", "content": f"Step {i}: build target t{i}, report errors in /srv/t{i}.log"})
        while True:
            reply = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools)
            if llm.completions:
                return reply
            message = reply.choices[0].message
            messages.append(message)
            if not message.tool_calls:
                break
            messages.extend({"role": "tool", "tool_call_id": c.id, "content": log_output(1_000, tag=f"t{i}")}
                            for c in message.tool_calls)
    raise AssertionError(f"no summary call after {rounds} rounds")


def test_it_manages_a_gateway_session_whose_summaries_come_from_the_real_server(
        alice, alice_token, llm, gateway_url, provider, settings):
    profile = _profile(alice, llm, settings)
    UpstreamProvider.objects.create(profile=profile, base_url=provider.base_url, api_key="sk-upstream",
                                    model_map={"gpt-4o": "fake-model-2026"}, timeout=30)
    provider.responder = tool_loop("run_shell", final="Built; no errors.")
    client = OpenAI(base_url=gateway_url, api_key=alice_token, max_retries=0, timeout=TIMEOUT + 30)
    reply = _agent_until_summary_call(client, llm, rounds=25)

    [exchange] = llm.completions
    session = AgentSession.objects.get()
    compaction = [t for t in session.turns.order_by("number") if _has_summary_call(t.trace)]
    assert len(compaction) == 1
    _assert_call_recorded(compaction[0].trace, exchange)
    # The agent's call went through whatever the summary model answered.
    assert reply.choices and reply.model == "fake-model-2026"
    after = provider.chat_requests[-1].body["messages"]
    summaries = [m for m in after if m.get("name") == "summary"]
    if check_summary(exchange.content, language="en").valid:
        assert compaction[0].outcome == "compacted"
        assert [m["content"] for m in summaries] and normalize_summary(exchange.content or "") in summaries[0]["content"]
    else:
        assert _saved_invalid(session, compaction[0].trace)["response"] == exchange.response
        if _fell_back(compaction[0].trace):
            assert compaction[0].outcome == "fallback_summary" and summaries
        else:
            assert compaction[0].outcome == "compaction_failed" and summaries == []
    assert_nothing_lost(session)


def _has_summary_call(trace: dict[str, Any]) -> bool:
    return any(s["step"] == "summary" and s["status"] in ("fired", "failed") for s in trace["steps"])
