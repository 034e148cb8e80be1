"""An OTLP JSON trace file, imported like a transcript (API, CLI), becomes an observed session."""

from __future__ import annotations

import json

from google.protobuf.json_format import MessageToDict
from openai import OpenAI
from openinference.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from contextlab.cli import main
from contextlab.sessions.models import AgentSession
from tests.gateway.provider import Provider, tool_loop


def _trace_file(path) -> list:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        with Provider(tool_loop(rounds=2)) as upstream:
            client = OpenAI(base_url=upstream.base_url, api_key="sk-agent", max_retries=0)
            messages: list = [{"role": "system", "content": "You fix builds."},
                              {"role": "user", "content": "Fix the nightly build."}]
            for _ in range(3):
                reply = client.chat.completions.create(model="fake-model-2026", messages=messages).choices[0].message
                messages.append(reply.model_dump(exclude_none=True))
                if reply.tool_calls:
                    messages.append({"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "ok"})
            sent = [r.body for r in upstream.chat_requests]
    finally:
        instrumentor.uninstrument()
    # The collector's file exporter writes one OTLP JSON export per line.
    lines = [json.dumps(MessageToDict(encode_spans([span]))) for span in memory.get_finished_spans()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return sent


def test_it_imports_an_otlp_json_trace_through_the_api(api, alice, tmp_path):
    trace = tmp_path / "agent-trace.json"
    sent = _trace_file(trace)
    with trace.open("rb") as fh:
        response = api.client.post("/api/v1/imports", {"file": fh}, headers=api.headers)
    assert response.status_code in (200, 201, 202), response.content
    session = AgentSession.objects.get(owner=alice)
    assert session.source["format"] == "otlp" and session.source["requests"] == len(sent) == 3
    assert session.turns.count() == 3


def test_the_cli_reports_what_the_trace_shows(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    _trace_file(trace)
    assert main(["import-otlp", str(trace), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [c["requests"] for c in report["conversations"]] == [3]


def test_the_cli_says_when_a_file_holds_no_llm_call(tmp_path, capsys):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"resourceSpans": []}), encoding="utf-8")
    assert main(["import-otlp", str(empty)]) == 2
    assert "holds no LLM call" in capsys.readouterr().err


def test_it_imports_the_valid_spans_of_a_file_and_names_the_ones_it_left_out(api, alice, tmp_path):
    trace = tmp_path / "agent-trace.json"
    _trace_file(trace)
    lines = trace.read_text(encoding="utf-8").splitlines()
    broken = json.loads(lines[0])
    span = broken["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["attributes"] = {"not": "a list"}
    trace.write_text("\n".join([json.dumps(broken), *lines]) + "\n", encoding="utf-8")
    with trace.open("rb") as fh:
        response = api.client.post("/api/v1/imports", {"file": fh}, headers=api.headers)
    assert response.status_code in (200, 201, 202), response.content
    session = AgentSession.objects.get(owner=alice)
    assert session.turns.count() == 3
    assert session.source["warnings"] == ["span left out: attributes is not a list of key-value objects"]
