"""What Arize Phoenix reads from ContextLab's spans: a recorded check of the attributes.

Phoenix itself is too heavy to install in CI, so the check names every attribute
through ``openinference-semantic-conventions``, the package Phoenix and the
OpenInference instrumentations share: a renamed attribute fails here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from openai import OpenAI
from openinference.semconv.resource import ResourceAttributes
from openinference.semconv.trace import (
    MessageAttributes,
    OpenInferenceSpanKindValues,
    SpanAttributes,
)
from opentelemetry.trace import StatusCode

from contextlab.support import telemetry
from tests.gateway.provider import Answer, scripted
from tests.telemetry.collector import Collector

MESSAGES = [{"role": "system", "content": "You are a build agent."}, {"role": "user", "content": "Build it."}]


@pytest.fixture
def collector(monkeypatch) -> Iterator[Collector]:
    monkeypatch.setenv("CONTEXTLAB_OTEL_PROJECT", "my-agents")
    with Collector() as running:
        telemetry.configure(running.http_endpoint)
        yield running
    telemetry.disable()


def _call(gateway_url: str, token: str, messages: list) -> None:
    OpenAI(base_url=gateway_url, api_key=token, max_retries=0, timeout=60).chat.completions.create(
        model="gpt-4o", messages=messages)


def _message(attributes: dict, prefix: str, index: int, field: str):
    return attributes.get(f"{prefix}.{index}.{field}")


def test_the_gateway_span_is_an_llm_span_phoenix_can_show(collector, gateway_url, alice_token, upstream,
                                                          provider) -> None:
    provider.responder = scripted(Answer("Built, 0 errors.", model="fake-model-2026-05-01"))
    _call(gateway_url, alice_token, MESSAGES)
    assert telemetry.flush()
    [call] = collector.spans("chat gpt-4o")
    attributes = call.attributes
    assert attributes[SpanAttributes.OPENINFERENCE_SPAN_KIND] == OpenInferenceSpanKindValues.LLM.value
    assert call.resource[ResourceAttributes.PROJECT_NAME] == "my-agents"
    assert attributes[SpanAttributes.SESSION_ID] == attributes["contextlab.session.id"]
    assert attributes[SpanAttributes.LLM_MODEL_NAME] == attributes["gen_ai.request.model"] == "fake-model-2026"
    assert attributes[SpanAttributes.LLM_PROVIDER] == attributes["gen_ai.provider.name"] == "openai"
    assert attributes[SpanAttributes.LLM_SYSTEM] == attributes["gen_ai.system"] == "openai"
    assert attributes["gen_ai.response.model"] == "fake-model-2026-05-01"
    assert attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert attributes[SpanAttributes.LLM_TOKEN_COUNT_PROMPT] == attributes["gen_ai.usage.input_tokens"]
    # The payload as it went upstream (after the hook), message for message, and the reply.
    sent = provider.chat_requests[-1].body["messages"]
    prefix = SpanAttributes.LLM_INPUT_MESSAGES
    for index, message in enumerate(sent):
        assert _message(attributes, prefix, index, MessageAttributes.MESSAGE_ROLE) == message["role"]
        assert _message(attributes, prefix, index, MessageAttributes.MESSAGE_CONTENT) == message["content"]
    assert _message(attributes, prefix, len(sent), MessageAttributes.MESSAGE_ROLE) is None
    output = SpanAttributes.LLM_OUTPUT_MESSAGES
    assert _message(attributes, output, 0, MessageAttributes.MESSAGE_CONTENT) == "Built, 0 errors."
    structured = json.loads(attributes["gen_ai.input.messages"])
    assert [m["role"] for m in structured] == [m["role"] for m in sent]
    assert structured[1]["parts"] == [{"type": "text", "content": "Build it."}]


def test_turn_and_step_spans_are_chains_in_execution_order(collector, gateway_url, alice_token, upstream,
                                                            provider) -> None:
    _call(gateway_url, alice_token, MESSAGES)
    assert telemetry.flush()
    [turn] = collector.spans("contextlab.turn")
    assert turn.attributes[SpanAttributes.OPENINFERENCE_SPAN_KIND] == OpenInferenceSpanKindValues.CHAIN.value
    assert turn.attributes[SpanAttributes.SESSION_ID] == turn.attributes["contextlab.session.id"]
    steps = [s for s in collector.spans() if s.parent_span_id == turn.span_id]
    assert len(steps) >= 3
    assert all(s.attributes[SpanAttributes.OPENINFERENCE_SPAN_KIND] == "CHAIN" for s in steps)
    # Sorted by start time, the steps read in the order the engine ran them, with no two at one instant.
    starts = [s.start_ns for s in steps]
    assert len(set(starts)) == len(starts)
    by_start = [s.name for s in sorted(steps, key=lambda s: s.start_ns)]
    assert by_start[0] == "contextlab.gate" and by_start[-1] == "contextlab.result"


def test_message_content_is_capped_and_can_be_left_out(collector, gateway_url, alice_token, upstream, provider,
                                                       monkeypatch) -> None:
    monkeypatch.setenv("CONTEXTLAB_OTEL_CONTENT_MAX_CHARS", "30")
    long = [MESSAGES[0], {"role": "user", "content": "Build it. " * 20}]
    _call(gateway_url, alice_token, long)
    monkeypatch.setenv("CONTEXTLAB_OTEL_CAPTURE_CONTENT", "false")
    _call(gateway_url, alice_token, [*long, {"role": "assistant", "content": "ok"},
                                     {"role": "user", "content": "Again."}])
    assert telemetry.flush()
    capped, hidden = sorted(collector.spans("chat gpt-4o"), key=lambda s: s.start_ns)
    prefix = SpanAttributes.LLM_INPUT_MESSAGES
    system = _message(capped.attributes, prefix, 0, MessageAttributes.MESSAGE_CONTENT)
    user = _message(capped.attributes, prefix, 1, MessageAttributes.MESSAGE_CONTENT)
    assert system == "You are a build agent."
    # 30 characters for the span: 22 of the system prompt, 8 of the user's 200.
    assert user == "Build it…[192 more characters]"
    assert not any(key.startswith((prefix, SpanAttributes.LLM_OUTPUT_MESSAGES, "gen_ai.input", "gen_ai.output"))
                   for key in hidden.attributes)
    assert hidden.attributes[SpanAttributes.LLM_MODEL_NAME] == "fake-model-2026"


def test_a_payload_still_over_the_window_is_an_error(collector, gateway_url, alice_token, upstream,
                                                     provider) -> None:
    # One message larger than the 4,000-token window: nothing can be compacted away.
    huge = [MESSAGES[0], {"role": "user", "content": "word " * 6_000}]
    _call(gateway_url, alice_token, huge)
    assert telemetry.flush()
    [turn] = collector.spans("contextlab.turn")
    [call] = collector.spans("chat gpt-4o")
    assert turn.status_code == StatusCode.ERROR.value
    assert call.status_code == StatusCode.ERROR.value
