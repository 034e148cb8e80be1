"""OTLP traces in: LLM spans of the three attribute layouts become the agent's chat requests."""

from __future__ import annotations

import json

from google.protobuf.json_format import MessageToDict
from openai import OpenAI
from openinference.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from contextlab.engine.observe.otlp import llm_requests, load_json_lines, spans_from_json
from tests.gateway.provider import Provider, tool_loop

TOOLS = [{"type": "function", "function": {"name": "run_shell", "description": "Run a shell command",
                                            "parameters": {"type": "object", "properties": {
                                                "command": {"type": "string"}}}}}]


def _string(key: str, value: str) -> dict:
    return {"key": key, "value": {"stringValue": value}}


def _export(attributes: list[dict], *, start: int = 1, name: str = "chat") -> dict:
    return {"resourceSpans": [{"resource": {"attributes": [_string("service.name", "agent")]}, "scopeSpans": [
        {"spans": [{"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": f"{start:016x}", "name": name,
                    "startTimeUnixNano": str(start), "attributes": attributes}]}]}]}


def test_it_reads_the_genai_conventions_structured_messages():
    messages = [
        {"role": "user", "parts": [{"type": "text", "content": "List the files."}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "run_shell",
                                         "arguments": {"command": "ls"}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "a.py\nb.py"}]},
    ]
    export = _export([
        _string("gen_ai.operation.name", "chat"), _string("gen_ai.request.model", "gpt-4o"),
        _string("gen_ai.system_instructions", json.dumps([{"type": "text", "content": "You are terse."}])),
        _string("gen_ai.input.messages", json.dumps(messages)),
        _string("gen_ai.output.messages", json.dumps([{"role": "assistant", "finish_reason": "stop",
                                                       "parts": [{"type": "text", "content": "Two files."}]}])),
        {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "57"}},
        _string("gen_ai.conversation.id", "conv-7"),
    ])
    [record] = llm_requests(spans_from_json(export))
    assert record["body"] == {"model": "gpt-4o", "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "run_shell", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"},
    ]}
    assert record["response_text"] == "Two files." and record["usage"] == {"prompt_tokens": 57}
    assert record["session_id"] == "conv-7" and record["seq"] == 1


def test_it_reads_the_older_flattened_prompt_attributes():
    export = _export([
        _string("gen_ai.request.model", "gpt-4o-mini"),
        _string("gen_ai.prompt.0.role", "system"), _string("gen_ai.prompt.0.content", "Be brief."),
        _string("gen_ai.prompt.1.role", "user"), _string("gen_ai.prompt.1.content", "Check the build."),
        _string("gen_ai.prompt.2.role", "assistant"),
        _string("gen_ai.prompt.2.tool_calls.0.id", "c9"), _string("gen_ai.prompt.2.tool_calls.0.name", "make"),
        _string("gen_ai.prompt.2.tool_calls.0.arguments", "{}"),
        _string("gen_ai.prompt.3.role", "tool"), _string("gen_ai.prompt.3.tool_call_id", "c9"),
        _string("gen_ai.prompt.3.content", "ok"),
        _string("gen_ai.completion.0.role", "assistant"), _string("gen_ai.completion.0.content", "Green."),
    ])
    [record] = llm_requests(spans_from_json(export))
    assert [m["role"] for m in record["body"]["messages"]] == ["system", "user", "assistant", "tool"]
    assert record["body"]["messages"][2]["tool_calls"][0]["function"]["name"] == "make"
    assert record["body"]["messages"][3] == {"role": "tool", "content": "ok", "tool_call_id": "c9"}
    assert record["response_text"] == "Green."


def test_spans_that_are_not_llm_calls_are_left_out_and_calls_come_in_time_order():
    later = _export([_string("gen_ai.prompt.0.role", "user"), _string("gen_ai.prompt.0.content", "second")],
                    start=20)
    earlier = _export([_string("gen_ai.prompt.0.role", "user"), _string("gen_ai.prompt.0.content", "first")],
                      start=10)
    tool_span = _export([_string("http.method", "GET")], start=5, name="GET /status")
    text = "\n".join(json.dumps(e) for e in (later, tool_span, earlier))
    records = llm_requests(load_json_lines(text))
    assert [r["body"]["messages"][0]["content"] for r in records] == ["first", "second"]
    assert [r["seq"] for r in records] == [1, 2]


def test_official_openinference_instrumentation_of_the_openai_client_round_trips():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    sent = []
    try:
        with Provider(tool_loop()) as upstream:
            client = OpenAI(base_url=upstream.base_url, api_key="sk-test", max_retries=0)
            messages: list = [{"role": "system", "content": "You build things."},
                              {"role": "user", "content": "Build the app."}]
            first = client.chat.completions.create(model="fake-model-2026", messages=messages, tools=TOOLS)
            call = first.choices[0].message.tool_calls[0]
            messages += [first.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": "built"}]
            client.chat.completions.create(model="fake-model-2026", messages=messages, tools=TOOLS)
            sent = [r.body for r in upstream.chat_requests]
    finally:
        instrumentor.uninstrument()
    # What a collector's OTLP/JSON file holds for these spans.
    export = MessageToDict(encode_spans(exporter.get_finished_spans()))
    records = llm_requests(spans_from_json(export))
    assert [r["body"]["messages"] for r in records] == [body["messages"] for body in sent]
    assert records[0]["body"]["tools"] == TOOLS
    assert records[0]["response_tool_calls"][0]["function"]["name"] == "run_shell"
    assert records[1]["response_text"] == "All done."
    assert records[0]["usage"] == {"prompt_tokens": 321, "completion_tokens": 54}
