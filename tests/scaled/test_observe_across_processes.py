"""Observe mode across processes: a CoPaw run's calls alternate between two web processes.

Each web process keeps a profile's inference and the rows its last rewrite wrote,
and feeds it only the new call. When the other process recorded calls since,
the kept inference no longer describes the profile's calls and must be read
again: a process that trusted it would skip the other's calls and write rows
that leave them out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from tests.gateway.provider import Answer, Provider
from tests.observed.copaw import recorded_requests
from tests.scaled.conftest import skip_unless_scaled

pytestmark = skip_unless_scaled

PROCESS_ORDER = (0, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1)

SETUP = """
import json
from django.contrib.auth.models import User
from contextlab.gateway.models import UpstreamProvider
from contextlab.sessions.models import AgentProfile
alice = User.objects.get(username="alice")
profile = AgentProfile.objects.create(owner=alice, name="copaw-observed", policy="copaw", max_input_length=12000)
UpstreamProvider.objects.create(profile=profile, base_url={base_url!r}, api_key="sk-upstream",
                                mode=UpstreamProvider.Mode.OBSERVE, timeout=60)
print(json.dumps(profile.name))
"""

# The rows as the two processes left them, then as a rewrite from every recorded call writes them.
STATE = """
import json
import time
from contextlab.gateway import observe
from contextlab.gateway.models import ObservedCall
from contextlab.sessions.models import AgentSession, SessionMessage, Turn
from contextlab.sessions.services.observed import observed_session_write

def rows(session):
    return {
        "messages": [list(r) for r in SessionMessage.objects.filter(session=session).order_by("seq").values_list(
            "message_id", "seq", "status", "truncated_stage", "compacted_turn", "summary_version", "fate")],
        "turns": [list(t) for t in Turn.objects.filter(session=session).order_by("number").values_list(
            "number", "outcome", "compacted_count")],
    }

# The web processes answer first and rebuild after: once no call is pending, every
# rebuild has committed (a call leaves the pending state in its rebuild's transaction).
deadline = time.monotonic() + 120
while (ObservedCall.objects.filter(status_code=200, error="", conversation="").exclude(kind="prewarm").exists()
       and time.monotonic() < deadline):
    time.sleep(0.05)
[session] = AgentSession.objects.filter(source__format="observed", profile__name="copaw-observed")
served = rows(session)
calls = ObservedCall.objects.filter(profile=session.profile, status_code=200, error="").order_by("pk")
requests = [observe._recorded_request(seq, call) for seq, call in enumerate(calls, start=1)]
observed_session_write(session, requests, "c1")
print(json.dumps({"served": served, "rewritten": rows(session), "calls": calls.count(),
                  "compactions": AgentSession.objects.get(pk=session.pk).compactions_count}))
"""


@pytest.fixture(scope="module")
def recordings() -> list[dict[str, Any]]:
    return recorded_requests()


@pytest.fixture(scope="module")
def provider(recordings: list[dict[str, Any]]) -> Iterator[Provider]:
    def respond(body: dict[str, Any]) -> Answer:
        found = next(r for r in recordings if r["body"]["messages"] == body["messages"])
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in found.get("response_tool_calls") or []]
        return Answer(content=found["response_text"] or None, tool_calls=calls)

    with Provider(respond) as stub:
        yield stub


def test_an_observed_run_alternating_between_processes_keeps_every_call(deployment, provider, recordings):
    profile = deployment.python(SETUP.format(base_url=provider.base_url))
    urls = [f"{deployment.processes[name].url}/v1/chat/completions" for name in ("web1", "web2")]
    headers = {"Authorization": f"Bearer {deployment.token}", "Content-Type": "application/json",
               "X-ContextLab-Profile": profile}
    with httpx2.Client(timeout=60) as http:
        for number, found in enumerate(recordings):
            # Runs of one to three calls on each process: every switch meets a kept
            # inference the other process moved on from.
            url = urls[PROCESS_ORDER[number % len(PROCESS_ORDER)]]
            answer = http.post(url, content=json.dumps(found["body"]).encode(), headers=headers)
            assert answer.status_code == 200, answer.text

    state = deployment.python(STATE)
    assert state["calls"] == len(recordings) == 75
    assert state["compactions"] == 4
    # What the two processes wrote call by call is what a rewrite from every call writes.
    assert state["served"] == state["rewritten"]
    assert len(state["served"]["turns"]) == 59 and len(state["served"]["messages"]) > 100
