"""Hook runs exported as OTLP spans (HTTP/protobuf and gRPC), received by a real receiver."""

from __future__ import annotations

import pytest

from contextlab.sessions import services
from contextlab.support import telemetry
from tests.conversations import answer, tool_turn

STEPS = {"contextlab.gate", "contextlab.tool_result_compaction", "contextlab.context_check", "contextlab.result"}


def _work(session, turns: int, captured) -> None:
    for i in range(1, turns + 1):
        with captured(execute=True):
            services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                *tool_turn(i, output_bytes=1_500)])
            services.session_prepare(session=session)


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_it_exports_each_hook_run_as_a_span_tree(collector, alice_session, django_capture_on_commit_callbacks,
                                                  protocol):
    endpoint = collector.http_endpoint if protocol == "http/protobuf" else collector.grpc_endpoint
    telemetry.configure(endpoint, protocol)
    _work(alice_session, 12, django_capture_on_commit_callbacks)
    assert telemetry.flush()
    turns = sorted(collector.spans("contextlab.turn"), key=lambda s: s.attributes["contextlab.turn.number"])
    alice_session.refresh_from_db()
    assert [s.attributes["contextlab.turn.number"] for s in turns] == list(range(1, alice_session.turns_count + 1))
    assert {s.transport for s in turns} == {protocol}
    first = turns[0]
    assert first.resource["service.name"] == "contextlab"
    assert first.attributes["contextlab.session.id"] == str(alice_session.pk)
    assert first.attributes["contextlab.policy"] == "contextlab"
    assert first.attributes["contextlab.budget.window"] == 4_000
    assert first.attributes["contextlab.payload.tokens"] > 0
    # Each decision step is a child span of its turn, inside the turn's time.
    children = [s for s in collector.spans() if s.parent_span_id == first.span_id]
    assert {s.name for s in children} >= STEPS
    assert all(first.start_ns <= s.start_ns <= s.end_ns <= first.end_ns + 1_000_000 for s in children)
    assert all(s.trace_id == first.trace_id for s in children)
    # The compactions carry what they archived and the summary's verdict.
    compacted = [s for s in turns if s.attributes["contextlab.turn.outcome"] == "compacted"]
    assert compacted and all(s.attributes["contextlab.archived"] > 0 for s in compacted)
    assert all(s.attributes["contextlab.summary.valid"] is True for s in compacted)
    summary_steps = [s for s in collector.spans("contextlab.summary") if s.parent_span_id == compacted[0].span_id]
    assert summary_steps and summary_steps[0].attributes["contextlab.step.status"] == "fired"


def test_it_exports_nothing_and_costs_nothing_when_no_endpoint_is_set(monkeypatch, collector, alice_session,
                                                                     django_capture_on_commit_callbacks):
    for name in ("CONTEXTLAB_OTEL_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    telemetry.disable()
    monkeypatch.setattr(telemetry, "_configured", False)
    assert telemetry.endpoint_from_environment() is None

    def one_turn(i: int) -> int:
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            services.messages_append(session=alice_session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                      *tool_turn(i)])
            services.session_prepare(session=alice_session)
        return len(callbacks)

    off = one_turn(1)
    assert telemetry.tracer() is None
    telemetry.configure(collector.http_endpoint)
    on = one_turn(2)
    # With export on, the turn registers exactly one more after-commit step: its span.
    assert on == off + 1
    assert telemetry.flush() and [s.attributes["contextlab.turn.number"] for s in collector.spans("contextlab.turn")
                                  ] == [2]


def test_it_reads_the_standard_otlp_variables(monkeypatch):
    monkeypatch.delenv("CONTEXTLAB_OTEL_ENDPOINT", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert telemetry.endpoint_from_environment() == ("http://collector:4317", "grpc")
    monkeypatch.setenv("CONTEXTLAB_OTEL_PROTOCOL", "thrift")
    with pytest.raises(ValueError, match="CONTEXTLAB_OTEL_PROTOCOL must be one of http/protobuf, grpc"):
        telemetry.endpoint_from_environment()


def test_a_collector_that_is_down_never_fails_a_turn(alice_session, django_capture_on_commit_callbacks):
    telemetry.configure("http://127.0.0.1:9", "http/protobuf")  # the discard port: nobody answers
    try:
        with django_capture_on_commit_callbacks(execute=True):
            services.messages_append(session=alice_session, messages=tool_turn(1))
            payload, trace = services.session_prepare(session=alice_session)
        assert trace["turn"] == 1 and payload
    finally:
        telemetry.disable()


def test_it_sends_the_standard_otlp_headers_to_a_backend_under_a_prefix(monkeypatch, collector, alice_session,
                                                                         django_capture_on_commit_callbacks):
    # docs/otel.md's Langfuse set-up: OTLP under /api/public/otel, HTTP Basic credentials
    # from OTEL_EXPORTER_OTLP_HEADERS.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Basic cGs6c2s=")
    telemetry.configure(collector.http_endpoint + "/api/public/otel")
    _work(alice_session, 3, django_capture_on_commit_callbacks)
    assert telemetry.flush()
    assert collector.spans("contextlab.turn")
    assert collector.http_requests
    assert all(path == "/api/public/otel/v1/traces" for path, _ in collector.http_requests)
    assert all(headers.get("authorization") == "Basic cGs6c2s=" for _, headers in collector.http_requests)
