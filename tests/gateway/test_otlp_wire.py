"""The OTLP/HTTP receiver as the spec and real exporters have it: gzip, answers in the request's
encoding, partial success for the spans it cannot take, the user's own profile."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import httpx2
import pytest
from google.protobuf.json_format import MessageToDict
from google.rpc.status_pb2 import Status
from openai import OpenAI
from openinference.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from contextlab.gateway.models import ObservedCall
from contextlab.gateway.otlp import decompressed
from contextlab.sessions.models import AgentProfile, AgentSession
from tests.gateway.provider import Answer, Provider, scripted, tool_loop

SYSTEM = {"role": "system", "content": "You are a build agent."}


@pytest.fixture
def memory() -> Iterator[InMemorySpanExporter]:
    """An agent's openai client traced by OpenInference, its spans kept in memory."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    yield exporter
    instrumentor.uninstrument()
    provider.shutdown()


def _agent_run(base_url: str, system: dict = SYSTEM, task: str = "Build the app.") -> None:
    client = OpenAI(base_url=base_url, api_key="sk-agent", max_retries=0)
    messages: list = [system, {"role": "user", "content": task}]
    while True:
        reply = client.chat.completions.create(model="fake-model-2026", messages=messages).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return
        messages.append({"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "built, 0 errors"})


def _url(server: str) -> str:
    return f"{server}/otlp/v1/traces"


@pytest.mark.parametrize("compression", [Compression.Gzip, Compression.Deflate, Compression.NoCompression])
def test_it_takes_the_sdk_exporters_batches_in_every_compression(gateway_server, alice, alice_token, memory,
                                                                 compression) -> None:
    with Provider(tool_loop(rounds=1)) as upstream:
        _agent_run(upstream.base_url)
    exporter = OTLPSpanExporter(endpoint=_url(gateway_server), headers={"Authorization": f"Bearer {alice_token}"},
                                compression=compression)
    assert exporter.export(memory.get_finished_spans()) == SpanExportResult.SUCCESS
    exporter.shutdown()
    assert ObservedCall.objects.filter(owner=alice).count() == 2
    assert AgentSession.objects.get(owner=alice).turns.count() == 2


def _post(server: str, token: str, data: bytes, content_type: str, **headers: str) -> httpx2.Response:
    with httpx2.Client(timeout=30) as http:
        return http.post(_url(server), content=data, headers={"Authorization": f"Bearer {token}",
                                                              "Content-Type": content_type, **headers})


def test_it_answers_protobuf_with_protobuf_and_json_with_json(gateway_server, alice, alice_token, memory) -> None:
    with Provider(tool_loop(rounds=1)) as upstream:
        _agent_run(upstream.base_url)
    export = encode_spans(memory.get_finished_spans())
    answer = _post(gateway_server, alice_token, gzip.compress(export.SerializeToString()), "application/x-protobuf",
                   **{"Content-Encoding": "gzip"})
    assert answer.status_code == 200 and answer.headers["Content-Type"] == "application/x-protobuf"
    parsed = ExportTraceServiceResponse()
    parsed.ParseFromString(answer.content)
    assert not parsed.HasField("partial_success")
    as_json = _post(gateway_server, alice_token, gzip.compress(json.dumps(MessageToDict(export)).encode()),
                    "application/json", **{"Content-Encoding": "gzip"})
    assert as_json.status_code == 200 and as_json.json() == {}
    # A protobuf request that is not an export: a protobuf google.rpc.Status, never a page.
    broken = _post(gateway_server, alice_token, b"\xff\x00garbage", "application/x-protobuf")
    assert broken.status_code == 400 and broken.headers["Content-Type"] == "application/x-protobuf"
    status = Status()
    status.ParseFromString(broken.content)
    assert status.code == 3 and "not an OTLP trace export" in status.message
    cut = _post(gateway_server, alice_token, gzip.compress(b'{"resourceSpans": []}')[:-6], "application/json",
                **{"Content-Encoding": "gzip"})
    assert cut.status_code == 400 and "gzip" in cut.json()["message"]
    unknown = _post(gateway_server, alice_token, b"{}", "application/json", **{"Content-Encoding": "br"})
    assert unknown.status_code == 415 and unknown.json()["code"] == 3


def test_it_refuses_a_gzip_bomb_with_a_413_once_it_passes_the_limit() -> None:
    bomb = gzip.compress(b"\0" * (4 * 1024 * 1024))
    assert len(bomb) < 10_000
    assert decompressed(bomb, "gzip", 4 * 1024 * 1024) == b"\0" * (4 * 1024 * 1024)
    with pytest.raises(Exception) as refused:
        decompressed(bomb, "gzip", 1024 * 1024)
    assert getattr(refused.value, "status", None) == 413 and "1,048,576 bytes" in str(refused.value) and "CONTEXTLAB_MAX_BODY_BYTES" in str(refused.value)


def test_it_reads_every_member_of_a_gzip_body_within_the_limit() -> None:
    two = gzip.compress(b'{"resourceSpans": ') + gzip.compress(b"[]}")
    assert decompressed(two, "gzip", 1024) == b'{"resourceSpans": []}'
    with pytest.raises(Exception) as refused:
        decompressed(gzip.compress(b"x" * 600) + gzip.compress(b"y" * 600), "gzip", 1000)
    assert getattr(refused.value, "status", None) == 413


def test_it_sends_a_gzip_bomb_back_as_a_413_status(gateway_server, alice_token, settings) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
    answer = _post(gateway_server, alice_token, gzip.compress(b" " * (8 * 1024 * 1024)), "application/json",
                   **{"Content-Encoding": "gzip"})
    assert answer.status_code == 413 and answer.json()["code"] == 8


def _llm_span(span_id: str, text: str, *, attributes: object = None) -> dict:
    messages = [{"role": "system", "parts": [{"type": "text", "content": "You are a build agent."}]},
                {"role": "user", "parts": [{"type": "text", "content": text}]}]
    return {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": span_id, "name": "chat fake-model",
            "startTimeUnixNano": str(1_700_000_000_000_000_000 + int(span_id, 16)),
            "attributes": attributes if attributes is not None else [
                {"key": "gen_ai.request.model", "value": {"stringValue": "fake-model"}},
                {"key": "gen_ai.input.messages", "value": {"stringValue": json.dumps(messages)}},
                {"key": "gen_ai.output.messages", "value": {"stringValue": json.dumps(
                    [{"role": "assistant", "parts": [{"type": "text", "content": "On it."}]}])}}]}


def test_it_keeps_the_valid_spans_of_a_batch_and_reports_the_others(gateway_server, alice, alice_token) -> None:
    good = _llm_span("00000000000000a1", "Build the app for the first time, please.")
    inner_surrogate = _llm_span("00000000000000a2", "Build \ud800 the app.")  # in the messages' own JSON
    attribute_surrogate = _llm_span("00000000000000a3", "Build the app.", attributes=[
        {"key": "gen_ai.request.model", "value": {"stringValue": "fake\ud800"}}])
    wrong_type = _llm_span("00000000000000a4", "Build the app.", attributes={"gen_ai.request.model": "m"})
    wrong_time = {**_llm_span("00000000000000a5", "Build the app."), "startTimeUnixNano": {"nanos": 1}}
    export = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [
        good, inner_surrogate, attribute_surrogate, wrong_type, wrong_time]}]}]}
    # ensure_ascii writes each lone surrogate as the JSON escape a broken client sends.
    answer = _post(gateway_server, alice_token, json.dumps(export).encode(), "application/json")
    assert answer.status_code == 200, answer.text
    partial = answer.json()["partialSuccess"]
    assert int(partial["rejectedSpans"]) == 4
    assert "lone surrogate" in partial["errorMessage"] and "not a list" in partial["errorMessage"]
    [call] = ObservedCall.objects.filter(owner=alice)
    assert call.span.endswith("/00000000000000a1")
    assert AgentSession.objects.get(owner=alice).turns.count() == 1


def test_it_keeps_the_valid_spans_of_a_protobuf_batch_with_one_that_is_not_utf8(gateway_server, alice,
                                                                                 alice_token, memory) -> None:
    with Provider(tool_loop(rounds=1)) as upstream:
        _agent_run(upstream.base_url)
    data = encode_spans(memory.get_finished_spans()).SerializeToString()
    # The second call's reply, written as a lone surrogate's bytes: no protobuf string may hold them.
    assert b"All done." in data
    broken = data.replace(b"All done.", b"All\xed\xa0\x80don")
    answer = _post(gateway_server, alice_token, broken, "application/x-protobuf")
    assert answer.status_code == 200 and answer.headers["Content-Type"] == "application/x-protobuf"
    parsed = ExportTraceServiceResponse()
    parsed.ParseFromString(answer.content)
    assert parsed.partial_success.rejected_spans == 1
    assert "not valid protobuf" in parsed.partial_success.error_message
    [call] = ObservedCall.objects.filter(owner=alice)
    assert call.body["messages"][-1]["content"] == "Build the app."


def test_it_files_the_sessions_in_the_users_only_profile(gateway_server, alice, alice_token, memory) -> None:
    mine = AgentProfile.objects.create(owner=alice, name="my-agent", max_input_length=32_000)
    with Provider(tool_loop(rounds=1)) as upstream:
        _agent_run(upstream.base_url)
    export = encode_spans(memory.get_finished_spans())
    assert _post(gateway_server, alice_token, export.SerializeToString(), "application/x-protobuf").status_code == 200
    session = AgentSession.objects.get(owner=alice)
    assert session.profile == mine and session.tokens_window == 32_000
    assert list(AgentProfile.objects.filter(owner=alice)) == [mine]


def test_it_files_the_sessions_in_the_profile_the_resource_names(gateway_server, alice, alice_token) -> None:
    AgentProfile.objects.create(owner=alice, name="first")
    second = AgentProfile.objects.create(owner=alice, name="second")
    provider = TracerProvider(resource=Resource.create({"contextlab.profile": "second"}))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        with Provider(tool_loop(rounds=1)) as upstream:
            _agent_run(upstream.base_url)
    finally:
        instrumentor.uninstrument()
    export = encode_spans(exporter.get_finished_spans())
    assert _post(gateway_server, alice_token, export.SerializeToString(), "application/x-protobuf").status_code == 200
    assert AgentSession.objects.get(owner=alice).profile == second


def test_it_keeps_two_traced_runs_apart_that_share_continue(gateway_server, alice, alice_token, memory) -> None:
    # No session.id: two runs with their own system prompts and tasks and one "continue" each.
    with Provider(scripted(Answer("Working on it."))) as upstream:
        client = OpenAI(base_url=upstream.base_url, api_key="sk-agent", max_retries=0)
        runs = {"a": [{"role": "system", "content": "You are a release engineer."},
                      {"role": "user", "content": "Tag version 2.4.1 and publish the wheel."}],
                "b": [{"role": "system", "content": "You write the team's documentation."},
                      {"role": "user", "content": "Rewrite the install guide for Windows."}]}
        for _ in range(3):
            for messages in runs.values():
                client.chat.completions.create(model="fake-model-2026", messages=messages)
                messages += [{"role": "assistant", "content": "Working on it."}, {"role": "user", "content": "continue"}]
    export = encode_spans(memory.get_finished_spans())
    assert _post(gateway_server, alice_token, export.SerializeToString(), "application/x-protobuf").status_code == 200
    sessions = list(AgentSession.objects.filter(owner=alice))
    assert len(sessions) == 2
    assert sorted(s.turns.count() for s in sessions) == [3, 3]
    assert all(s.compactions_count == 0 for s in sessions)


def test_its_pages_say_observed_where_no_policy_of_ours_ran(gateway_server, alice, alice_token, memory) -> None:
    from django.test import Client
    from django.urls import reverse

    with Provider(tool_loop(rounds=1)) as upstream:
        _agent_run(upstream.base_url)
    export = encode_spans(memory.get_finished_spans())
    assert _post(gateway_server, alice_token, export.SerializeToString(), "application/x-protobuf").status_code == 200
    session = AgentSession.objects.get(owner=alice)
    browser = Client()
    browser.force_login(alice)
    for url in (session.get_absolute_url(), reverse("cl-sessions"), session.turns.first().get_absolute_url()):
        page = browser.get(url).content.decode()
        assert "contextlab policy" not in page, url
        assert "observed" in page, url


def test_it_files_the_sessions_in_the_profile_an_observe_mode_provider_routes_to(gateway_server, alice,
                                                                                alice_token, memory) -> None:
    from contextlab.gateway.models import UpstreamProvider

    AgentProfile.objects.create(owner=alice, name="default")
    watched = AgentProfile.objects.create(owner=alice, name="watched")
    UpstreamProvider.objects.create(profile=watched, base_url="http://127.0.0.1:9/v1", api_key="sk-up",
                                    mode=UpstreamProvider.Mode.OBSERVE)
    with Provider(tool_loop(rounds=1)) as upstream:
        _agent_run(upstream.base_url)
    export = encode_spans(memory.get_finished_spans())
    assert _post(gateway_server, alice_token, export.SerializeToString(), "application/x-protobuf").status_code == 200
    assert AgentSession.objects.get(owner=alice).profile == watched


def test_a_span_the_database_cannot_store_costs_only_itself(gateway_server, alice, alice_token) -> None:
    from django.db import connection

    # PostgreSQL stores no NUL character in JSON text; SQLite does. Either way the good span stays.
    good = _llm_span("00000000000000b1", "Build the app for the first time, please.")
    nul = _llm_span("00000000000000b2", "Build the app\x00 from the tarball.")
    export = {"resourceSpans": [{"scopeSpans": [{"spans": [good, nul]}]}]}
    answer = _post(gateway_server, alice_token, json.dumps(export).encode(), "application/json")
    assert answer.status_code == 200, answer.text
    spans = set(ObservedCall.objects.filter(owner=alice).values_list("span", flat=True))
    assert any(s.endswith("/00000000000000b1") for s in spans)
    if connection.vendor == "postgresql":
        assert int(answer.json()["partialSuccess"]["rejectedSpans"]) == 1
        assert "could not be stored" in answer.json()["partialSuccess"]["errorMessage"]
    else:
        assert answer.json() == {} and len(spans) == 2
