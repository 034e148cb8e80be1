"""What carries the agent's trace into ContextLab's: the OpenInference openai instrumentation sends no
``traceparent`` by itself; a request hook on the client's HTTP transport does (docs/otel.md)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest
from openai import OpenAI
from openinference.instrumentation.openai import OpenAIInstrumentor
from opentelemetry import propagate
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from contextlab.support import telemetry
from tests.telemetry.collector import Collector

MESSAGES = [{"role": "system", "content": "You are a build agent."}, {"role": "user", "content": "Build it."}]


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector() as running:
        telemetry.configure(running.http_endpoint)
        yield running
    telemetry.disable()


@pytest.fixture
def agent_spans() -> Iterator[InMemorySpanExporter]:
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    yield memory
    instrumentor.uninstrument()
    provider.shutdown()


def _inject(request: httpx2.Request) -> None:
    # The hook docs/otel.md shows: the current span (OpenInference's LLM span) goes out as traceparent.
    propagate.inject(request.headers)


def test_the_instrumentation_alone_sends_no_traceparent(collector, agent_spans, gateway_url, alice_token,
                                                        upstream, provider) -> None:
    OpenAI(base_url=gateway_url, api_key=alice_token, max_retries=0).chat.completions.create(
        model="gpt-4o", messages=MESSAGES)
    assert telemetry.flush()
    [agent] = agent_spans.get_finished_spans()
    [gateway] = collector.spans("chat gpt-4o")
    assert gateway.trace_id != f"{agent.context.trace_id:032x}"


def test_a_request_hook_puts_the_gateway_span_under_the_agents(collector, agent_spans, gateway_url, alice_token,
                                                               upstream, provider) -> None:
    client = OpenAI(base_url=gateway_url, api_key=alice_token, max_retries=0,
                    http_client=httpx2.Client(event_hooks={"request": [_inject]}))
    client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert telemetry.flush()
    [agent] = agent_spans.get_finished_spans()
    [gateway] = collector.spans("chat gpt-4o")
    assert gateway.trace_id == f"{agent.context.trace_id:032x}"
    assert gateway.parent_span_id == f"{agent.context.span_id:016x}"
