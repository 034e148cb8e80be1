"""The Anthropic Messages API through the gateway, with the official anthropic SDK, unmodified.

The upstream is a scripted Anthropic server on a real socket (tests/gateway/anthropic_provider.py);
ContextLab runs under the live server; the SDK only gets a base URL and a key.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from contextlab.dashboard import fragments
from contextlab.gateway.models import GatewayExchange, ObservedCall, UpstreamProvider
from contextlab.gateway.protocols import anthropic_messages
from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, AgentSession
from contextlab.support import providers
from tests.conversations import log_output
from tests.gateway.anthropic_provider import Answer, AnthropicProvider, last_tool_results, text, tool_use

STORED_KEY = "sk-ant-stored-upstream-key"
MODEL = "claude-sonnet-5"
SYSTEM = [{"type": "text", "text": "You are a build engineer.", "cache_control": {"type": "ephemeral"}}]
TOOLS = [{"name": "run_shell", "description": "Run a shell command",
          "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]


@pytest.fixture
def anthropic_upstream() -> Iterator[AnthropicProvider]:
    with AnthropicProvider() as provider:
        yield provider


def _route(profile: AgentProfile, upstream: AnthropicProvider, *, mode: str = "observe",
           credential: str = "stored", kind: str = "anthropic") -> UpstreamProvider:
    return UpstreamProvider.objects.create(profile=profile, base_url=upstream.base_url, kind=kind, mode=mode,
                                           credential=credential, api_key=providers.encrypt_secret(STORED_KEY),
                                           timeout=30)


@pytest.fixture
def big_profile(alice: User) -> AgentProfile:
    return services.profile_create(owner=alice, name="claude", knobs={"max_input_length": 200_000})


def _client(gateway_server: str, **kwargs: Any) -> anthropic.Anthropic:
    kwargs.setdefault("max_retries", 0)
    return anthropic.Anthropic(base_url=gateway_server, timeout=30, **kwargs)


def _tool_loop(answer_after_tools: str = "Built; no errors.", *, thinking: bool = True):
    ids = itertools.count(1)

    def brain(body: dict[str, Any]) -> Answer:
        if last_tool_results(body):
            return text(answer_after_tools)
        number = next(ids)
        return tool_use("run_shell", {"command": f"make t{number}"}, f"toolu_{number:03d}",
                        thinking=f"I should build target {number}." if thinking else "")

    return brain


# -- observe ---------------------------------------------------------------------------------


def test_it_forwards_a_messages_call_unchanged_and_records_it(gateway_server, alice_token, big_profile,
                                                              anthropic_upstream):
    _route(big_profile, anthropic_upstream)
    anthropic_upstream.brain = lambda body: text("The build is green.")
    client = _client(gateway_server, api_key=alice_token,
                     default_headers={"anthropic-beta": "context-management-2025-06-27"})
    reply = client.messages.create(model=MODEL, max_tokens=100, system=SYSTEM,
                                   messages=[{"role": "user", "content": "Is the build green?"}],
                                   extra_body={"future_parameter": {"kept": True}})
    assert reply.content[0].text == "The build is green."
    assert reply.usage.cache_read_input_tokens == 800

    sent = anthropic_upstream.messages_requests[-1]
    assert sent.path == "/v1/messages"
    assert sent.body["system"] == SYSTEM and sent.body["future_parameter"] == {"kept": True}
    assert sent.headers["x-api-key"] == STORED_KEY
    assert sent.headers["anthropic-beta"] == "context-management-2025-06-27"
    assert sent.headers["anthropic-version"] == client.default_headers["anthropic-version"]
    call = ObservedCall.objects.get()
    assert (call.endpoint, call.status_code, call.error) == ("anthropic.messages", 200, "")
    assert call.body == sent.body and call.reply_text == "The build is green."
    assert call.usage["cache_creation_input_tokens"] == 100
    session = AgentSession.objects.get()
    assert session.title == "Is the build green?" and session.turns_count == 1


@pytest.mark.parametrize("mode", ["observe", "manage"])
def test_it_relays_the_event_stream_and_records_the_reply(gateway_server, alice_token, big_profile,
                                                          anthropic_upstream, mode):
    _route(big_profile, anthropic_upstream, mode=mode)
    anthropic_upstream.brain = _tool_loop()
    client = _client(gateway_server, api_key=alice_token)
    messages: list[Any] = [{"role": "user", "content": "Build t1."}]
    with client.messages.stream(model=MODEL, max_tokens=100, system=SYSTEM, tools=TOOLS,
                                messages=messages) as stream:
        kinds = [event.type for event in stream]
        first = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    assert first.content[0].type == "thinking" and first.content[0].signature == "sig-toolu_001"
    assert first.content[1].type == "tool_use" and first.content[1].input == {"command": "make t1"}

    messages += [{"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_001",
                                               "content": "ok"}]}]
    with client.messages.stream(model=MODEL, max_tokens=100, system=SYSTEM, tools=TOOLS,
                                messages=messages) as stream:
        assert stream.get_final_text() == "Built; no errors."
    # The thinking block went back upstream verbatim, signature and all.
    echoed = anthropic_upstream.messages_requests[-1].body["messages"][1]["content"][0]
    assert echoed == {"type": "thinking", "thinking": "I should build target 1.", "signature": "sig-toolu_001"}

    session = AgentSession.objects.get()
    assert session.turns_count == 2
    calls = [b["id"] for m in session.messages.order_by("seq") if m.role == "assistant" for b in m.content
             if b["type"] == "tool_use"]
    assert calls == ["toolu_001"]
    if mode == "manage":
        rows = list(GatewayExchange.objects.order_by("created").values_list("endpoint", "managed", "identity"))
        assert rows == [("anthropic.messages", True, "new"), ("anthropic.messages", True, "continued")]
    else:
        assert list(ObservedCall.objects.values_list("error", flat=True)) == ["", ""]


@pytest.mark.parametrize("mode", ["observe", "manage"])
def test_a_stream_the_upstream_cuts_is_recorded_as_failed_and_raises_in_the_sdk(gateway_server, alice_token,
                                                                                big_profile, anthropic_upstream,
                                                                                mode):
    _route(big_profile, anthropic_upstream, mode=mode)
    anthropic_upstream.brain = lambda body: Answer([{"type": "text", "text": "half an answ"}], cut_after=4)
    client = _client(gateway_server, api_key=alice_token)
    with pytest.raises(anthropic.APIError, match="ended before message_stop"), client.messages.stream(
            model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "Build."}]) as stream:
        stream.get_final_message()
    if mode == "observe":
        call = ObservedCall.objects.get()
        assert call.error == "the stream ended before message_stop" and call.reply_text == ""
        assert not AgentSession.objects.exists()  # a failed call joins no conversation
    else:
        row = GatewayExchange.objects.get()
        assert row.error_stage == "upstream" and "ended before message_stop" in row.error
        assert not AgentSession.objects.filter(turns_count__gt=0).exists()


def test_it_passes_count_tokens_through(gateway_server, alice_token, big_profile, anthropic_upstream):
    _route(big_profile, anthropic_upstream)
    client = _client(gateway_server, api_key=alice_token)
    counted = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert counted.input_tokens == 4321
    sent = anthropic_upstream.received[-1]
    assert sent.path == "/v1/messages/count_tokens" and sent.headers["x-api-key"] == STORED_KEY
    assert not ObservedCall.objects.exists()


# -- manage ----------------------------------------------------------------------------------


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGAAAAAEAAH2FzhVAAAAAElFTkSuQmCC"},
         "cache_control": {"type": "ephemeral"}}
DOCUMENT = {"type": "document", "title": "spec.pdf", "citations": {"enabled": True},
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQKJcTl8uXrCg=="}}
UNKNOWN = {"type": "container_upload", "file_id": "file_011CNha8iCJcU1wXNR6q4V8w"}


def _with_media(log: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": [{"type": "text", "text": "Does the screenshot match the spec?"}, IMAGE, DOCUMENT,
                                     UNKNOWN]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_001", "name": "run_shell",
                                           "input": {"command": "make check"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_001", "content": log}]},
    ]


@pytest.mark.parametrize("log_lines", [3, 6_000], ids=["kept-whole", "tool-output-cut"])
def test_it_sends_image_and_document_blocks_as_they_came_in_manage_mode(
        gateway_server, alice_token, big_profile, anthropic_upstream, log_lines):
    _route(big_profile, anthropic_upstream, mode="manage")
    anthropic_upstream.brain = lambda body: text("They match.")
    log = "".join(f"check {i:05d}: ok in src/module_{i % 41}.c\n" for i in range(log_lines))
    client = _client(gateway_server, api_key=alice_token)
    client.messages.create(model=MODEL, max_tokens=50, system=SYSTEM, tools=TOOLS, messages=_with_media(log))
    row = GatewayExchange.objects.get()
    assert (row.managed, row.error) == (True, "")
    sent = anthropic_upstream.messages_requests[0].body["messages"]
    # Block for block as the agent sent them, whether or not the engine changed anything else.
    assert sent[0]["content"] == [{"type": "text", "text": "Does the screenshot match the spec?"}, IMAGE, DOCUMENT,
                                  UNKNOWN]
    output = sent[2]["content"][0]["content"]
    if log_lines > 1_000:
        assert len(output) < len(log) // 2  # the engine did cut the large tool output
    else:
        assert output == log


def test_it_shows_unknown_block_types_in_the_turns_flow(gateway_server, alice_token, big_profile,
                                                        anthropic_upstream, alice_browser):
    _route(big_profile, anthropic_upstream, mode="manage")
    anthropic_upstream.brain = lambda body: text("They match.")
    client = _client(gateway_server, api_key=alice_token)
    client.messages.create(model=MODEL, max_tokens=50, system=SYSTEM, tools=TOOLS, messages=_with_media("ok\n"))
    turn = AgentSession.objects.get().turns.get()
    step = next(s for s in turn.trace["steps"] if s["step"] == "unknown_content")
    assert step["outcome"] == "kept verbatim, unread: unknown container_upload"
    assert step["details"]["unknown"] == [{"type": "container_upload", "at": "messages[0].content[3]"}]
    assert [s["step"] for s in turn.trace["steps"]][-2:] == ["unknown_content", "result"]
    page = alice_browser.get(reverse("cl-turn-detail", args=[turn.session_id, turn.number])).content.decode()
    assert "kept verbatim, unread: unknown container_upload" in page
    assert "unknown container_upload at messages[0].content[3]" in page


def test_it_manages_a_long_anthropic_conversation_without_splitting_a_tool_pair(gateway_server, alice_token,
                                                                               small_profile, anthropic_upstream):
    """Truncation on tool_result blocks, a summary as a user message, thinking sent verbatim."""
    _route(small_profile, anthropic_upstream, mode="manage")
    anthropic_upstream.brain = _tool_loop()
    client = _client(gateway_server, api_key=alice_token)
    messages: list[Any] = []
    for step in range(1, 16):
        messages.append({"role": "user", "content": f"Step {step}: build target t{step}."})
        while True:
            reply = client.messages.create(model=MODEL, max_tokens=100, system=SYSTEM, tools=TOOLS,
                                           messages=messages)
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
            calls = [b for b in reply.content if b.type == "tool_use"]
            if not calls:
                break
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": c.id, "content": log_output(1_000, tag=f"t{step}"),
                 "cache_control": {"type": "ephemeral"}} for c in calls]})

    session = AgentSession.objects.get()
    assert session.compactions_count >= 1
    assert all(row.managed and not row.error for row in GatewayExchange.objects.all())
    last = anthropic_upstream.messages_requests[-1].body
    assert last["system"] == SYSTEM and last["tools"] == TOOLS
    sent = last["messages"]
    assert len(sent) < len(messages)
    # The summary goes in as a user message, ahead of what the engine kept.
    assert sent[0]["role"] == "user" and "summary" in json.dumps(sent[0]).lower()
    # Every tool_result still follows the assistant message that called it.
    for index, message in enumerate(sent):
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block["type"] == "tool_result":
                called = [b["id"] for b in sent[index - 1]["content"] if b["type"] == "tool_use"]
                assert block["tool_use_id"] in called
                assert block["cache_control"] == {"type": "ephemeral"}
    # Thinking blocks go upstream exactly as the agent holds them, signatures included.
    thinking = [b for m in sent if m["role"] == "assistant" for b in m["content"] if b["type"] == "thinking"]
    assert thinking and all(b["signature"].startswith("sig-toolu_") for b in thinking)
    originals = {json.dumps(b, sort_keys=True) for m in messages if m["role"] == "assistant" for b in m["content"]}
    assert all(json.dumps(b, sort_keys=True) in originals for b in thinking)
    # Tool outputs were shortened in the tool_result blocks, not dropped from their pairs.
    sizes = [len(b["content"]) for m in sent if m["role"] == "user" and isinstance(m["content"], list)
             for b in m["content"] if b["type"] == "tool_result"]
    assert sizes and min(sizes) < len(log_output(1_000, tag="t1"))


def test_it_passes_unknown_block_types_through_unmanaged_when_the_engine_cannot_hold_them(
        gateway_server, alice_token, big_profile, anthropic_upstream):
    _route(big_profile, anthropic_upstream, mode="manage")
    body = {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Look."}, {"type": "hologram_2031", "payload": {"x": 1}}]}]}
    answer = httpx2.post(f"{gateway_server}/v1/messages", json=body, headers={"x-api-key": alice_token}, timeout=30)
    assert answer.status_code == 200
    assert anthropic_upstream.messages_requests[-1].body["messages"] == body["messages"]


# -- credentials -----------------------------------------------------------------------------


def test_it_takes_the_contextlab_token_as_a_bearer_token(gateway_server, alice_token, big_profile,
                                                         anthropic_upstream):
    _route(big_profile, anthropic_upstream)
    client = _client(gateway_server, auth_token=alice_token)
    assert client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}]).content
    headers = anthropic_upstream.messages_requests[-1].headers
    assert headers["x-api-key"] == STORED_KEY and "authorization" not in {k.lower() for k in headers}


@pytest.mark.parametrize("credential", ["stored", "client"])
@pytest.mark.parametrize("client_header", ["x-api-key", "authorization"])
def test_the_operator_chooses_whether_the_clients_own_credential_goes_upstream(
        gateway_server, alice_token, big_profile, anthropic_upstream, credential, client_header):
    _route(big_profile, anthropic_upstream, credential=credential)
    own = {"x-api-key": "sk-ant-users-own-key"} if client_header == "x-api-key" else {
        "authorization": "Bearer oauth-users-own"}
    answer = httpx2.post(f"{gateway_server}/v1/messages", timeout=30, headers={"X-ContextLab-Token": alice_token, **own},
                         json={"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200
    headers = {k.lower(): v for k, v in anthropic_upstream.messages_requests[-1].headers.items()}
    assert alice_token not in json.dumps(headers)
    if credential == "stored":
        assert headers["x-api-key"] == STORED_KEY and "authorization" not in headers
    elif client_header == "x-api-key":
        assert headers["x-api-key"] == "sk-ant-users-own-key" and "authorization" not in headers
    else:
        assert headers["authorization"] == "Bearer oauth-users-own" and "x-api-key" not in headers


def test_a_provider_that_forwards_the_clients_credential_wants_one(gateway_server, alice_token, big_profile,
                                                                   anthropic_upstream):
    _route(big_profile, anthropic_upstream, credential="client")
    client = _client(gateway_server, api_key=alice_token)
    with pytest.raises(anthropic.AuthenticationError, match="forwards your own Anthropic credential"):
        client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert not anthropic_upstream.received


# -- errors in Anthropic's shape -------------------------------------------------------------


def _post(gateway_server: str, content: bytes | str, token: str, path: str = "/v1/messages") -> httpx2.Response:
    return httpx2.post(f"{gateway_server}{path}", content=content, timeout=30,
                       headers={"x-api-key": token, "content-type": "application/json"})


def _error(answer: httpx2.Response) -> tuple[int, str, str]:
    data = answer.json()
    assert data["type"] == "error" and set(data["error"]) == {"type", "message"}
    return answer.status_code, data["error"]["type"], data["error"]["message"]


def test_an_unknown_token_gets_anthropics_authentication_error(gateway_server, big_profile, anthropic_upstream):
    _route(big_profile, anthropic_upstream)
    client = _client(gateway_server, api_key="sk-ant-not-a-contextlab-token")
    with pytest.raises(anthropic.AuthenticationError) as raised:
        client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert raised.value.body["error"]["type"] == "authentication_error"
    assert "X-ContextLab-Token" in raised.value.body["error"]["message"]
    assert not anthropic_upstream.received


def test_it_says_when_no_profile_routes_anywhere(gateway_server, alice_token, big_profile):
    status, kind, message = _error(_post(gateway_server, json.dumps(
        {"model": MODEL, "max_tokens": 5, "messages": []}), alice_token))
    assert (status, kind) == (400, "invalid_request_error") and "upstream provider" in message


def test_it_says_when_the_profile_routes_to_an_openai_provider(gateway_server, alice_token, big_profile,
                                                              anthropic_upstream):
    _route(big_profile, anthropic_upstream, kind="openai")
    status, kind, message = _error(_post(gateway_server, json.dumps(
        {"model": MODEL, "max_tokens": 5, "messages": []}), alice_token))
    assert (status, kind) == (400, "invalid_request_error") and "kind: anthropic" in message
    assert not anthropic_upstream.received


@pytest.mark.parametrize("mode", ["observe", "manage"])
def test_it_answers_for_an_upstream_that_is_down(gateway_server, alice_token, big_profile, mode):
    UpstreamProvider.objects.create(profile=big_profile, base_url="http://127.0.0.1:9/v1", kind="anthropic",
                                    mode=mode, api_key=providers.encrypt_secret(STORED_KEY), timeout=5)
    client = _client(gateway_server, api_key=alice_token)
    with pytest.raises(anthropic.APIStatusError) as raised:
        client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert raised.value.status_code == 502
    assert raised.value.body["error"]["type"] == "api_error"
    assert "could not be reached" in raised.value.body["error"]["message"]


@pytest.mark.parametrize(("content", "expected"), [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    (json.dumps({"model": MODEL, "messages": "hi"}), "messages: a list of messages is required"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": 5}]}), "messages.0.content"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": [{"text": "x"}]}]}),
     "messages.0.content.0"),
    (json.dumps({"messages": []}), "model:"),
])
@pytest.mark.parametrize("mode", ["observe", "manage"])
def test_a_bad_body_gets_a_clear_400_and_records_nothing(gateway_server, alice_token, big_profile,
                                                         anthropic_upstream, content, expected, mode):
    _route(big_profile, anthropic_upstream, mode=mode)
    status, kind, message = _error(_post(gateway_server, content, alice_token))
    assert (status, kind) == (400, "invalid_request_error") and expected in message
    assert not anthropic_upstream.received
    assert not ObservedCall.objects.exists() and not GatewayExchange.objects.exists()


def test_an_oversized_body_gets_anthropics_413(gateway_server, alice_token, big_profile, anthropic_upstream,
                                               settings):
    _route(big_profile, anthropic_upstream)
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    body = json.dumps({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x" * 20_000}]})
    status, kind, _ = _error(_post(gateway_server, body, alice_token))
    assert (status, kind) == (413, "request_too_large")
    assert not anthropic_upstream.received and not ObservedCall.objects.exists()


def test_a_get_is_refused_in_anthropics_shape(gateway_server, alice_token):
    answer = httpx2.get(f"{gateway_server}/v1/messages", headers={"x-api-key": alice_token}, timeout=30)
    assert _error(answer)[:2] == (405, "invalid_request_error") and answer.headers["Allow"] == "POST"


# -- the provider's own context editing ------------------------------------------------------

EDITS = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 30000},
                    "keep": {"type": "tool_uses", "value": 3}}, {"type": "clear_thinking_20251015", "keep": "all"}]}
APPLIED = {"applied_edits": [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 8,
                              "cleared_input_tokens": 50000}]}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", ["observe", "manage"])
def test_the_providers_context_edits_show_in_the_turns_decision_flow(gateway_server, alice_token, big_profile,
                                                                     anthropic_upstream, mode, stream):
    _route(big_profile, anthropic_upstream, mode=mode)
    anthropic_upstream.brain = lambda body: text("Done.", context_management=APPLIED)
    client = _client(gateway_server, api_key=alice_token)
    request = {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "Go."}],
               "extra_body": {"context_management": EDITS}}
    if stream:
        with client.messages.stream(**request) as events:
            assert events.get_final_text() == "Done."
    else:
        assert client.messages.create(**request).content[0].text == "Done."
    assert anthropic_upstream.messages_requests[-1].body["context_management"] == EDITS

    turn = AgentSession.objects.get().turns.get()
    step = next(s for s in turn.trace["steps"] if s["step"] == "provider_context_edits")
    assert step["status"] == "fired"
    assert step["details"] == {"asked": EDITS["edits"], "applied": APPLIED["applied_edits"]}
    assert step["numbers"]["cleared_input_tokens"] == 50000 and step["numbers"]["cleared_tool_uses"] == 8
    assert [s["step"] for s in turn.trace["steps"]][-2:] == ["provider_context_edits", "result"]


# -- tokens: the provider's count is the truth -----------------------------------------------


@pytest.mark.parametrize("mode", ["observe", "manage"])
def test_the_session_shows_anthropics_usage_as_the_truth_and_ours_as_an_estimate(
        gateway_server, alice_token, big_profile, anthropic_upstream, alice_browser, mode):
    _route(big_profile, anthropic_upstream, mode=mode)
    anthropic_upstream.brain = lambda body: text("Done.")
    client = _client(gateway_server, api_key=alice_token)
    messages: list[Any] = [{"role": "user", "content": "First."}]
    reply = client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=messages)
    messages += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Second."}]
    assert client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=messages).content
    assert reply.usage.input_tokens == 1200

    session = AgentSession.objects.get()
    turn = session.turns.order_by("number").last()
    estimate = turn.payload_tokens
    page = alice_browser.get(reverse("cl-session-llm", args=[session.pk]), {"turn": turn.number}).content.decode()
    # input 1,200 + cache read 800 + cache write 100 = 2,100 reported.
    assert "Anthropic reported <strong>2,100</strong> input tokens" in page
    assert "input 1,200 · cache read 800 · cache creation 100 · output 25" in page
    assert f'<span data-k="estimate">{estimate:,}</span> (an estimate' in page
    assert f'<strong data-k="ratio">{round(2100 / estimate, 2)}</strong>' in page
    assert "over the session's 2 calls" in page
    detail = alice_browser.get(reverse("cl-turn-detail", args=[session.pk, turn.number])).content.decode()
    assert 'Anthropic usage (the truth): <span data-k="usage-input">1,200</span> input' in detail


@pytest.mark.parametrize("mode", ["observe", "manage"])
def test_it_shows_the_agents_count_tokens_answer_beside_ours_in_the_token_view(
        gateway_server, alice_token, big_profile, anthropic_upstream, alice_browser, mode):
    _route(big_profile, anthropic_upstream, mode=mode)
    anthropic_upstream.brain = lambda body: text("Done.")
    anthropic_upstream.count_tokens_answer = {"input_tokens": 5_432}
    client = _client(gateway_server, api_key=alice_token,
                     default_headers={"X-Claude-Code-Session-Id": "3f0c8a52-1d7e-4b8e-9a51-0c6d2e7f4b19"})
    messages: list[Any] = [{"role": "user", "content": "Read the build log and tell me what failed."}]
    client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=messages, tools=TOOLS)
    messages += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "How big is this now?"}]
    counted = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=messages, tools=TOOLS)
    assert counted.input_tokens == 5_432  # passed back as the provider answered

    session = AgentSession.objects.get()
    row = GatewayExchange.objects.get(endpoint=fragments.COUNT_TOKENS_ENDPOINT)
    assert fragments.COUNT_TOKENS_ENDPOINT == anthropic_messages.COUNT_ENDPOINT
    assert (row.session, row.turn_number, row.status_code, row.managed) == (session, 1, 200, False)
    ours = row.usage["contextlab_estimate"]
    assert row.usage["input_tokens"] == 5_432 and 20 < ours < 1_000
    page = alice_browser.get(reverse("cl-session-llm", args=[session.pk]), {"turn": 1}).content.decode()
    assert "Token count the agent asked for (Anthropic <code>count_tokens</code>)" in page
    assert '<strong data-k="count-provider">5,432</strong> input tokens by the provider' in page
    assert f"ContextLab's estimate of the same request: <span data-k=\"count-contextlab\">{ours:,}</span>" in page


def test_it_keeps_a_count_tokens_answer_without_numbers_when_it_has_none(
        gateway_server, alice_token, big_profile, anthropic_upstream):
    _route(big_profile, anthropic_upstream, mode="manage")
    anthropic_upstream.count_tokens_answer = {"type": "error"}
    client = _client(gateway_server, api_key=alice_token)
    client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    row = GatewayExchange.objects.get()
    assert (row.endpoint, row.usage, row.session) == (fragments.COUNT_TOKENS_ENDPOINT, None, None)


def _long_tool_history(uses: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Build everything."}]
    for n in range(1, uses + 1):
        messages.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"Target {n} next.", "signature": f"sig{n}"},
            {"type": "tool_use", "id": f"toolu_{n:03d}", "name": "run_shell", "input": {"command": f"make t{n}"}}]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n:03d}",
                                                      "content": f"t{n}: " + "compiled ok " * 50}]})
    return messages


@pytest.mark.parametrize("stream", [False, True])
def test_contextlab_runs_the_context_edits_an_upstream_cannot_and_answers_applied_edits(
        gateway_server, alice_token, big_profile, anthropic_upstream, stream):
    route = _route(big_profile, anthropic_upstream, mode="manage")
    route.context_edits = UpstreamProvider.ContextEdits.ENGINE
    route.save()
    anthropic_upstream.brain = lambda body: text("All built.")
    edits = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 100},
                        "keep": {"type": "tool_uses", "value": 2}},
                       {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]}
    body = {"model": MODEL, "max_tokens": 10, "tools": TOOLS, "messages": _long_tool_history(5),
            "context_management": edits, "stream": stream}
    answer = httpx2.post(f"{gateway_server}/v1/messages", json=body, headers={"x-api-key": alice_token}, timeout=30)
    assert answer.status_code == 200
    if stream:
        deltas = [json.loads(line[5:]) for line in answer.text.splitlines()
                  if line.startswith("data:") and '"message_delta"' in line]
        management = deltas[0]["context_management"]
    else:
        management = answer.json()["context_management"]
    applied = management["applied_edits"]
    assert [(e["type"], e.get("cleared_tool_uses"), e.get("cleared_thinking_turns")) for e in applied] == \
        [("clear_tool_uses_20250919", 3, None), ("clear_thinking_20251015", None, 4)]
    assert all(e["cleared_input_tokens"] > 0 for e in applied)

    sent = anthropic_upstream.messages_requests[-1].body
    assert "context_management" not in sent  # the upstream is asked for nothing it cannot do
    results = {b["tool_use_id"]: b["content"] for m in sent["messages"] if isinstance(m["content"], list)
               for b in m["content"] if b["type"] == "tool_result"}
    assert [n for n, content in sorted(results.items()) if content.startswith("[tool result cleared")] == \
        ["toolu_001", "toolu_002", "toolu_003"]
    assert results["toolu_005"].startswith("t5: compiled ok")
    thinking = [b["signature"] for m in sent["messages"] if m["role"] == "assistant" for b in m["content"]
                if b["type"] == "thinking"]
    assert thinking == ["sig5"]
    # Every tool_use still has its tool_result right after it.
    assert len(results) == 5

    step = next(s for s in AgentSession.objects.get().turns.get().trace["steps"]
                if s["step"] == "provider_context_edits")
    assert step["outcome"].startswith("ContextLab applied 2 context edit(s)")
    removed = step["details"]["removed"]
    assert [r["tool_use_id"] for r in removed if "tool_use_id" in r] == ["toolu_001", "toolu_002", "toolu_003"]
    assert sum(1 for r in removed if r.get("block") == "thinking") == 4
