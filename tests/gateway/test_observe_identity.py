"""Observe mode with several agent runs at once: each run its own session, whatever short words they share."""

from __future__ import annotations

import json

import httpx2
import pytest

from contextlab.gateway import observe as observe_gateway
from contextlab.gateway.models import ObservedCall, UpstreamProvider
from contextlab.sessions.models import AgentProfile, AgentSession
from tests.gateway.observed_calls import session_of
from tests.gateway.provider import Answer, Provider, scripted

TERSE = "Working on it."


@pytest.fixture
def observed(small_profile: AgentProfile, provider: Provider) -> UpstreamProvider:
    return UpstreamProvider.objects.create(profile=small_profile, base_url=provider.base_url, api_key="sk-up",
                                           mode=UpstreamProvider.Mode.OBSERVE, timeout=30)


def _post(url: str, token: str, messages: list, **headers: str) -> httpx2.Response:
    with httpx2.Client(timeout=30) as http:
        return http.post(f"{url}/chat/completions", content=json.dumps({"model": "gpt-4o", "messages": messages}),
                         headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", **headers})


RUNS = {
    "billing": ("You maintain the billing service.", "Find why invoices are off by one cent."),
    "review": ("You review pull requests for style.", "Review the open pull request on the parser."),
    "patch": ("You keep the servers patched.", "Patch the kernel on the staging hosts."),
}


def test_it_keeps_three_interleaved_runs_apart_when_the_upstream_answers_tersely(gateway_url, alice_token,
                                                                                  observed, provider) -> None:
    provider.responder = scripted(Answer(TERSE))
    held = {name: [{"role": "system", "content": prompt}, {"role": "user", "content": task}]
            for name, (prompt, task) in RUNS.items()}
    sessions: dict[str, set[str]] = {name: set() for name in RUNS}
    for round_ in range(4):
        for name in (RUNS if round_ % 2 == 0 else reversed(list(RUNS))):
            answer = _post(gateway_url, alice_token, held[name])
            assert answer.status_code == 200, answer.text
            sessions[name].add(session_of(answer))
            held[name] += [{"role": "assistant", "content": TERSE}, {"role": "user", "content": "continue"}]
    assert all(len(found) == 1 for found in sessions.values()), sessions
    assert len({next(iter(found)) for found in sessions.values()}) == 3
    for session in AgentSession.objects.filter(source__format="observed"):
        assert session.turns.count() == 4
        assert session.compactions_count == 0


def test_it_keeps_apart_runs_a_gateway_adapter_names_with_the_clients_ids(alice, observed, small_profile) -> None:
    # Two runs identical message for message: only the ids the client sent (Claude Code's
    # X-Claude-Code-Session-Id, read by an adapter) tell them apart.
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Fix the nightly build."}]
    found = []
    for client_id in ("cc-1", "cc-2", "cc-1", "cc-2"):
        call = ObservedCall(owner=alice, profile=small_profile, body={"messages": messages}, reply_text=TERSE,
                            status_code=200, client_id=client_id)
        found.append(observe_gateway.record(call, observed))
    assert found[0] == found[2] and found[1] == found[3] and found[0] != found[1]
    assert set(ObservedCall.objects.values_list("conversation", flat=True)) == {"c1", "c2"}


def test_it_reads_the_callers_trace_id_from_its_traceparent() -> None:
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert observe_gateway.caller_trace_id({"traceparent": f"00-{trace}-00f067aa0ba902b7-01"}) == trace
    assert observe_gateway.caller_trace_id({"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"}) == ""
    assert observe_gateway.caller_trace_id({"traceparent": "garbage"}) == ""
    assert observe_gateway.caller_trace_id({}) == ""
