"""A gateway call whose hook compacts holds no lock and no transaction while the summary model answers.

Other sessions keep taking writes (through the API services and through the
gateway) and the compacting session keeps answering reads; the compaction then
lands, the call goes upstream with the summary, and nothing is lost or doubled.

Runs on SQLite (a file database, see the conftest) and, in scaled mode, on PostgreSQL.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from django.test import Client

from contextlab.api.models import ApiToken
from contextlab.gateway.models import GatewayExchange, UpstreamProvider
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, Turn
from tests.conversations import answer, log_output, tool_turn
from tests.fakellm import FakeLLM, Gate, Reply
from tests.gateway.provider import Answer, Provider
from tests.invariants import assert_nothing_lost
from tests.sessions.concurrency.helpers import STEP_LIMIT_SECONDS, SUMMARY, in_thread

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = {"role": "system", "content": "You are a build engineer. Keep exact paths."}


class Agent:
    """An unmodified client's conversation: its whole history goes to the gateway on every call."""

    def __init__(self, token: str, first_ask: str) -> None:
        self.token = token
        self.messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": first_ask}]
        self.responses: list[Any] = []

    def call(self) -> Any:
        # A client of its own per call: each runs in its own thread.
        response = Client().post("/v1/chat/completions", json.dumps({"model": "gpt-4o", "messages": self.messages}),
                                 content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {self.token}")
        assert response.status_code == 200, response.content
        assert response["X-ContextLab-Managed"] == "true", GatewayExchange.objects.order_by("-id").first().error
        self.messages.append(json.loads(response.content)["choices"][0]["message"])
        self.responses.append(response)
        return response

    def ask(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})


def test_it_holds_nothing_while_a_gateway_calls_compaction_summary_runs(alice, settings):
    gate = Gate(Reply(SUMMARY))
    with FakeLLM([gate]) as llm, Provider(lambda body: Answer("Built.")) as upstream:
        settings.CONTEXTLAB_PROVIDERS = llm.provider
        profile = services.profile_create(owner=alice, name="remote", knobs={
            "max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400,
            "compactor": "openai", "compaction_provider": "fake", "compaction_model": "fake-model",
            "compaction_timeout": 120.0, "compaction_retries": 0,
        })
        UpstreamProvider.objects.create(profile=profile, base_url=upstream.base_url, api_key="sk-up", timeout=60)
        token = ApiToken.issue(user=alice, name="agent")[1]
        other_api_session = services.session_create(owner=alice, system_prompt="Another agent.", profile=profile,
                                                    title="b")
        services.messages_append(session=other_api_session, messages=tool_turn(1, output_bytes=200))

        agent = Agent(token, "Build every target and report the errors.")
        other_agent = Agent(token, "A second conversation, through the gateway too.")
        other_agent.call()

        # Calls until one's hook must summarise: that call then waits at the gate.
        errors: list[BaseException] = []
        compacting: threading.Thread | None = None
        for step in range(1, 40):
            agent.ask(f"Step {step}: here is the log of t{step}:\n{log_output(1_200, tag=f't{step}')}")
            compacting = in_thread(agent.call, errors)
            while compacting.is_alive() and not gate.arrived.is_set():
                compacting.join(0.05)
            if gate.arrived.is_set():
                break
            assert not errors, errors
        assert gate.arrived.is_set() and compacting is not None, "no gateway call ever compacted"
        session = AgentSession.objects.get(gateway__isnull=False, title__contains="Build every target")
        turns_before = Turn.objects.filter(session=session).count()

        read: list[Any] = []

        def traffic() -> None:
            # Another session's writes: through the API services and through the gateway.
            services.messages_append(session=other_api_session, messages=[answer(1), *tool_turn(2, output_bytes=200)])
            services.session_prepare(session=other_api_session)
            other_agent.ask("And one more thing.")
            other_agent.call()
            # The compacting session's reads: its last committed payload comes back at once.
            read.append(services.session_prepare(session=session))
            read.append(AgentSession.objects.get(pk=session.pk).turns_count)
            assert not gate.opened.is_set()

        traffic_errors: list[BaseException] = []
        worker = in_thread(traffic, traffic_errors)
        worker.join(STEP_LIMIT_SECONDS)
        assert not worker.is_alive(), "a request waited for the session whose summary is being written"
        assert not traffic_errors, traffic_errors
        payload, trace = read[0]
        assert trace["turn"] == turns_before, "a read during the summary call gets the last committed turn"

        gate.opened.set()
        compacting.join(STEP_LIMIT_SECONDS)
        assert not compacting.is_alive() and not errors, errors

    assert len(llm.requests) == 1
    session.refresh_from_db()
    assert session.summary_call_until is None
    response = agent.responses[-1]
    turn = Turn.objects.get(session=session, number=int(response["X-ContextLab-Turn"]))
    assert turn.outcome == "compacted", turn.trace
    # Written from the staged plan (the summary asked with nothing held), not under the lock.
    assert "planned" in next(s for s in turn.trace["steps"] if s["step"] == "context_check")["details"]
    # What went upstream for the compacting call: the summary, then the newest messages.
    sent = [r.body["messages"] for r in upstream.chat_requests if r.body["messages"][-1] == agent.messages[-2]]
    assert len(sent) == 1 and any(m.get("name") == "summary" for m in sent[0])
    assert_nothing_lost(session)
    assert_nothing_lost(other_api_session)

    # The conversation goes on in the same session, managed.
    agent.ask("Thanks; what is next?")
    agent.call()
    exchange = GatewayExchange.objects.order_by("-id").first()
    assert exchange.identity == "continued" and exchange.session_id == session.pk
    assert_nothing_lost(session)


def test_it_summarises_a_new_conversation_whose_first_call_is_over_the_threshold(alice, settings):
    with FakeLLM([Reply(SUMMARY)]) as llm, Provider(lambda body: Answer("Built.")) as upstream:
        settings.CONTEXTLAB_PROVIDERS = llm.provider
        profile = services.profile_create(owner=alice, name="remote", knobs={
            "max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400,
            "compactor": "openai", "compaction_provider": "fake", "compaction_model": "fake-model",
            "compaction_timeout": 120.0, "compaction_retries": 0,
        })
        UpstreamProvider.objects.create(profile=profile, base_url=upstream.base_url, api_key="sk-up", timeout=60)
        agent = Agent(ApiToken.issue(user=alice, name="agent")[1], "Build every target and report the errors.")
        for step in range(1, 16):
            agent.messages.append({"role": "assistant", "content": f"Looking at t{step}."})
            agent.ask(f"Step {step}: here is the log of t{step}:\n{log_output(1_200, tag=f't{step}')}")
        response = agent.call()

    assert len(llm.requests) == 1
    session = AgentSession.objects.get(pk=response["X-ContextLab-Session"])
    assert session.summary_call_until is None
    turn = Turn.objects.get(session=session, number=int(response["X-ContextLab-Turn"]))
    assert turn.outcome == "compacted", turn.trace
    # Written from the staged plan (the summary asked with nothing held), not under the lock.
    assert "planned" in next(s for s in turn.trace["steps"] if s["step"] == "context_check")["details"]
    assert any(m.get("name") == "summary" for m in upstream.chat_requests[-1].body["messages"])
    assert_nothing_lost(session)
    # The next call continues the new session.
    agent.ask("Thanks; what is next?")
    agent.call()
    exchange = GatewayExchange.objects.order_by("-id").first()
    assert exchange.identity == "continued" and exchange.session_id == session.pk
