"""OpenTelemetry in: an agent instrumented with the official OpenInference instrumentation exports
its spans to ContextLab's OTLP/HTTP receiver, and the conversation becomes an observed session."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx2
import pytest
from google.protobuf.json_format import MessageToDict
from openai import OpenAI
from openinference.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from contextlab.gateway.models import ObservedCall
from contextlab.gateway.observe import span_ref
from contextlab.sessions.models import AgentSession
from tests.gateway.provider import Provider, tool_loop

SYSTEM = {"role": "system", "content": "You are a build agent."}


@pytest.fixture
def instrumented() -> Iterator[TracerProvider]:
    """The openai client traced by OpenInference, as a team using Arize Phoenix has it."""
    provider = TracerProvider()
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    yield provider
    instrumentor.uninstrument()
    provider.shutdown()


def _agent_run(base_url: str) -> list[dict]:
    """An agent loop straight against its provider (not through the gateway): ask, call a tool, answer."""
    client = OpenAI(base_url=base_url, api_key="sk-agent", max_retries=0)
    messages: list = [SYSTEM, {"role": "user", "content": "Build the app."}]
    while True:
        reply = client.chat.completions.create(model="fake-model-2026", messages=messages).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return messages
        messages.append({"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "built, 0 errors"})


def test_an_instrumented_agents_spans_become_an_observed_session(gateway_server, alice, alice_token,
                                                                  instrumented):
    instrumented.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
        endpoint=f"{gateway_server}/otlp/v1/traces", headers={"Authorization": f"Bearer {alice_token}"})))
    with Provider(tool_loop(rounds=2)) as upstream:
        _agent_run(upstream.base_url)
        sent = [r.body["messages"] for r in upstream.chat_requests]
    assert len(sent) == 3
    # Every LLM call arrived, exactly as the agent sent it.
    calls = list(ObservedCall.objects.filter(owner=alice).order_by("pk"))
    assert [c.body["messages"] for c in calls] == sent
    session = AgentSession.objects.get(owner=alice)
    assert session.source["format"] == "observed"
    assert session.turns.count() == 3
    assert calls[-1].session_id == session.pk and calls[-1].reply_text == "All done."


def test_it_takes_otlp_json_too_and_refuses_what_is_not_a_trace(gateway_server, alice, alice_token, instrumented):
    memory = InMemorySpanExporter()
    instrumented.add_span_processor(SimpleSpanProcessor(memory))
    with Provider(tool_loop(rounds=1)) as upstream:
        _agent_run(upstream.base_url)
    export = MessageToDict(encode_spans(memory.get_finished_spans()))
    url = f"{gateway_server}/otlp/v1/traces"
    auth = {"Authorization": f"Bearer {alice_token}"}
    with httpx2.Client(timeout=30) as http:
        assert http.post(url, json=export).status_code == 401
        assert http.post(url, content=b"hello", headers={**auth, "Content-Type": "text/plain"}).status_code == 415
        broken = http.post(url, content=b"{not json", headers={**auth, "Content-Type": "application/json"})
        assert broken.status_code == 400 and "not an OTLP trace export" in broken.json()["message"]
        accepted = http.post(url, content=json.dumps(export), headers={**auth, "Content-Type": "application/json"})
    assert accepted.status_code == 200 and accepted.json() == {}
    assert ObservedCall.objects.filter(owner=alice).count() == 2
    assert AgentSession.objects.get(owner=alice).turns.count() == 2


def test_it_records_a_span_once_when_an_exporter_sends_its_batch_again(gateway_server, alice, alice_token,
                                                                      instrumented):
    # An OTLP exporter whose answer did not come back in time sends the same batch
    # again, though the first attempt was recorded: calls and turns must not double.
    memory = InMemorySpanExporter()
    instrumented.add_span_processor(SimpleSpanProcessor(memory))
    with Provider(tool_loop(rounds=1)) as upstream:
        _agent_run(upstream.base_url)
    spans = list(memory.get_finished_spans())
    assert len(spans) == 2
    url = f"{gateway_server}/otlp/v1/traces"
    headers = {"Authorization": f"Bearer {alice_token}", "Content-Type": "application/x-protobuf"}
    with httpx2.Client(timeout=30) as http:
        # The first call alone, then the whole run, sent again, then every span twice in one batch.
        for batch in (spans[:1], spans, spans, [*spans, *spans]):
            assert http.post(url, content=encode_spans(batch).SerializeToString(), headers=headers).status_code == 200
    calls = list(ObservedCall.objects.filter(owner=alice).order_by("pk"))
    assert len(calls) == 2
    # Stored as OTLP/JSON writes ids: 32 hex digits of trace, 16 of span.
    assert [c.span for c in calls] == [f"{s.context.trace_id:032x}/{s.context.span_id:016x}" for s in spans]
    assert AgentSession.objects.get(owner=alice).turns.count() == 2


def test_it_keeps_apart_span_ids_too_long_to_store_instead_of_cutting_them():
    long_trace = "f" * 120
    first = span_ref({"trace_id": long_trace, "span_id": "a" * 16})
    second = span_ref({"trace_id": long_trace, "span_id": "b" * 16})
    assert first != second and len(first) <= 100 and first.startswith("sha256:")
    assert span_ref({"trace_id": "0" * 32, "span_id": ""}) == ""
