"""The gateway in the caller's trace: its span continues the caller's, the hook run sits beneath it,
and the provider receives the trace context; with export off the caller's headers still pass on."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI

from contextlab.support import telemetry
from tests.gateway.provider import Error
from tests.telemetry.collector import Collector

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
MESSAGES = [{"role": "system", "content": "You are a build agent."}, {"role": "user", "content": "Build it."}]


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector() as running:
        telemetry.configure(running.http_endpoint)
        yield running
    telemetry.disable()


def _traced_client(gateway_url: str, token: str) -> OpenAI:
    return OpenAI(base_url=gateway_url, api_key=token, max_retries=0, timeout=30,
                  default_headers={"traceparent": TRACEPARENT, "tracestate": "vendor=agent"})


def test_a_gateway_call_is_a_genai_span_in_the_callers_trace(collector, gateway_url, alice_token, upstream,
                                                              provider):
    _traced_client(gateway_url, alice_token).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert telemetry.flush()
    [call] = collector.spans("chat gpt-4o")
    assert (call.trace_id, call.parent_span_id) == (CALLER_TRACE, CALLER_SPAN)
    assert call.attributes["gen_ai.operation.name"] == "chat"
    # The model the provider was asked for (the profile maps the client's name), and the client's own.
    assert call.attributes["gen_ai.request.model"] == "fake-model-2026"
    assert call.attributes["contextlab.gateway.client_model"] == "gpt-4o"
    assert call.attributes["gen_ai.usage.input_tokens"] == 321
    assert call.attributes["gen_ai.usage.output_tokens"] == 54
    assert call.attributes["contextlab.gateway.managed"] is True
    assert call.attributes["http.response.status_code"] == 200
    # The hook run that prepared the payload is the call's child.
    [turn] = collector.spans("contextlab.turn")
    assert (turn.trace_id, turn.parent_span_id) == (CALLER_TRACE, call.span_id)
    assert turn.attributes["contextlab.session.id"] == call.attributes["contextlab.session.id"]
    # The provider was called inside the same trace, under the gateway's span.
    sent = provider.chat_requests[-1].headers
    assert sent["traceparent"].split("-")[1:3] == [CALLER_TRACE, call.span_id]
    assert sent["tracestate"] == "vendor=agent"


def test_a_refused_call_is_an_error_span_and_no_turn(collector, gateway_url, alice_token, upstream, provider):
    provider.responder = lambda body: Error(503)
    with pytest.raises(openai.InternalServerError):
        _traced_client(gateway_url, alice_token).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert telemetry.flush()
    [call] = collector.spans("chat gpt-4o")
    assert call.status_code == 2  # ERROR
    assert call.attributes["http.response.status_code"] == 503
    assert collector.spans("contextlab.turn") == []


def test_with_export_off_the_callers_trace_headers_still_reach_the_provider(gateway_url, alice_token, upstream,
                                                                            provider):
    telemetry.disable()
    _traced_client(gateway_url, alice_token).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    sent = provider.chat_requests[-1].headers
    assert sent["traceparent"] == TRACEPARENT and sent["tracestate"] == "vendor=agent"


def test_an_observed_call_is_a_span_in_the_callers_trace_too(collector, gateway_url, alice_token, upstream,
                                                              provider):
    upstream.mode = "observe"
    upstream.save()
    _traced_client(gateway_url, alice_token).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert telemetry.flush()
    [call] = collector.spans("chat gpt-4o")
    assert (call.trace_id, call.parent_span_id) == (CALLER_TRACE, CALLER_SPAN)
    assert call.attributes["gen_ai.usage.input_tokens"] == 321
    assert call.attributes["contextlab.gateway.managed"] is False
    # The provider gets the agent's request unchanged, inside the same trace.
    assert provider.chat_requests[-1].headers["traceparent"].split("-")[1:3] == [CALLER_TRACE, call.span_id]
