"""``/v1/responses`` through the gateway with the official ``openai`` client, unmodified, in both modes.

The provider is ``responses_upstream``: a real HTTP server that answers in the
Responses API's shapes and streams its events one by one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx2
import openai
import pytest
from openai import OpenAI

from contextlab.gateway.models import GatewayExchange, ObservedCall, UpstreamProvider
from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, AgentSession
from contextlab.support import providers
from tests.gateway.responses_upstream import (
    Failure,
    Reply,
    ResponsesUpstream,
    compaction,
    function_call,
    reasoning,
    scripted,
    text,
)
from tests.gateway.servers import embedded_only, gateway_under_daphne


@pytest.fixture
def responses_upstream() -> Iterator[ResponsesUpstream]:
    with ResponsesUpstream() as upstream:
        yield upstream


@pytest.fixture
def big_profile(alice) -> AgentProfile:
    return services.profile_create(owner=alice, name="big", knobs={"max_input_length": 100_000})


def _route(profile: AgentProfile, upstream: ResponsesUpstream, mode: str) -> UpstreamProvider:
    return UpstreamProvider.objects.create(profile=profile, base_url=upstream.base_url, mode=mode, timeout=30,
                                           api_key=providers.encrypt_secret("sk-upstream"))


@pytest.fixture
def client(gateway_url: str, alice_token: str) -> OpenAI:
    return OpenAI(base_url=gateway_url, api_key=alice_token, max_retries=0, timeout=30)


# -- observe mode -------------------------------------------------------------------------------


def test_it_relays_a_streamed_response_event_by_event_and_records_it(client, responses_upstream, big_profile):
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.OBSERVE)
    responses_upstream.responder = scripted(Reply([reasoning(), text("Paris is the capital.")], input_tokens=42))
    with client.responses.stream(model="gpt-5", instructions="Answer briefly.",
                                 input="What is the capital of France?") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and kinds.count("response.output_item.done") == 2
    assert final.output_text == "Paris is the capital."
    call = ObservedCall.objects.get()
    assert (call.endpoint, call.status_code, call.error) == ("responses", 200, "")
    assert call.reply_text == "Paris is the capital."
    assert call.usage["input_tokens"] == 42 and call.response_id == responses_upstream.response_ids[0]
    # The agent's bytes went upstream unchanged.
    assert responses_upstream.posts[0].body == call.body
    session = call.session
    assert session is not None and session.title == "What is the capital of France?"
    assert list(session.messages.order_by("seq").values_list("role", flat=True)) == ["system", "user"]


def test_it_answers_a_plain_response_with_the_providers_bytes(gateway_url, alice_token, responses_upstream,
                                                               big_profile):
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.OBSERVE)
    responses_upstream.responder = scripted(Reply([text("hello")]))
    answer = httpx2.post(f"{gateway_url}/responses", headers={"Authorization": f"Bearer {alice_token}"},
                         json={"model": "gpt-5", "input": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert answer.status_code == 200
    assert answer.json()["id"] == responses_upstream.response_ids[0]
    assert answer.json()["output"][0]["content"][0]["text"] == "hello"
    assert answer.headers["X-ContextLab-Managed"] == "false"


def test_it_follows_a_previous_response_id_chain_into_one_session(client, responses_upstream, big_profile):
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.OBSERVE)
    responses_upstream.responder = scripted(
        Reply([function_call("read_file", {"path": "a.txt"}, call_id="call_a")]),
        Reply([text("a.txt holds the number 7.")]))
    first = client.responses.create(model="gpt-5", input="What is in a.txt? Use the tool to read it.",
                                    instructions="You read files for the user.",
                                    tools=[{"type": "function", "name": "read_file", "parameters": {}}])
    second = client.responses.create(model="gpt-5", previous_response_id=first.id,
                                     instructions="You read files for the user.", input=[
        {"type": "function_call_output", "call_id": "call_a", "output": "7"}])
    assert second.output_text == "a.txt holds the number 7."
    calls = list(ObservedCall.objects.order_by("pk"))
    assert calls[0].session == calls[1].session
    session = calls[1].session
    assert session.source["warnings"] == []
    roles = list(session.messages.order_by("seq").values_list("role", flat=True))
    # The instructions, the question, the call, its output (tool results are system-role blocks).
    assert roles == ["system", "user", "assistant", "system"]


def test_it_says_so_when_a_chain_starts_outside_contextlab(client, responses_upstream, big_profile):
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.OBSERVE)
    client.responses.create(model="gpt-5", previous_response_id="resp_elsewhere",
                            input="And now the second part of the question, please.")
    session = ObservedCall.objects.get().session
    assert session is not None
    assert any("resp_elsewhere" in w and "did not pass through ContextLab" in w for w in session.source["warnings"])


def test_it_records_a_stream_cut_midway_as_failed(client, responses_upstream, big_profile):
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.OBSERVE)
    responses_upstream.responder = scripted(Reply([text("this answer never ends well")], break_after=4))
    # The agent's bytes as they came: the stream just stops, and the SDK says so.
    with pytest.raises(RuntimeError, match="response.completed"), \
            client.responses.stream(model="gpt-5", input="Tell me a long story.") as stream:
        for _ in stream:
            pass
        stream.get_final_response()
    call = ObservedCall.objects.get()
    assert call.error and call.reply_text == ""
    assert call.session is None and not AgentSession.objects.exists()


def test_it_records_a_failed_response_as_failed(client, responses_upstream, big_profile):
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.OBSERVE)
    responses_upstream.responder = scripted(Failure(500))
    with pytest.raises(openai.InternalServerError):
        client.responses.create(model="gpt-5", input="hi")
    call = ObservedCall.objects.get()
    assert call.status_code == 500 and call.session is None


def test_it_recognises_a_remote_compaction_and_marks_its_summary_opaque(gateway_url, alice_token, client,
                                                                        responses_upstream, big_profile):
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.OBSERVE)
    summary = compaction("the user wants the tests fixed")
    history = [{"role": "user", "content": "Please fix the failing tests in the parser module today."},
               {"type": "message", "role": "assistant", "content": [
                   {"type": "output_text", "text": "I will start with test_parser.py and its fixtures."}]}]
    responses_upstream.responder = scripted(Reply([text("Working on it.")]), Reply([summary]),
                                            Reply([text("Continuing.")]))
    system = {"role": "developer", "content": "You are a coding agent."}
    client.responses.create(model="gpt-5", input=[system, *history[:1]])
    compacted = httpx2.post(f"{gateway_url}/responses/compact", headers={"Authorization": f"Bearer {alice_token}"},
                            json={"model": "gpt-5", "input": [system, *history]}, timeout=30)
    assert compacted.status_code == 200
    assert responses_upstream.posts[1].path == "/v1/responses/compact"
    client.responses.create(model="gpt-5", input=[system, summary, {"role": "user", "content": "Go on."}])
    calls = list(ObservedCall.objects.order_by("pk"))
    assert [c.kind for c in calls] == ["", "compaction.remote", ""]
    assert calls[1].side_call and calls[1].session == calls[0].session == calls[2].session
    contents = json.dumps([m.content for m in calls[2].session.messages.all()])
    assert "encrypted by the provider: opaque to ContextLab" in contents
    assert summary["encrypted_content"] not in contents
    steps = {step["step"]: step for turn in calls[2].session.turns.all() for step in turn.trace["steps"]
             if step["status"] == "fired"}
    assert steps["summary"]["details"]["compactor"] == "side call, request 2"


def test_it_skips_codex_prewarm_calls_in_the_inference(gateway_url, alice_token, responses_upstream, big_profile):
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.OBSERVE)
    answer = httpx2.post(f"{gateway_url}/responses", json={"model": "gpt-5", "input": "warm up"}, timeout=30,
                         headers={"Authorization": f"Bearer {alice_token}",
                                  "x-codex-turn-metadata": json.dumps({"request_kind": "prewarm"})})
    assert answer.status_code == 200
    call = ObservedCall.objects.get()
    assert call.kind == "prewarm" and call.session is None


# -- bad input, auth, WebSocket ------------------------------------------------------------------


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "gpt-5", "input": 5}, "input"),
    ({"model": "gpt-5", "input": ["text"]}, "input[0]"),
    ({"model": "gpt-5"}, "input"),
    ({"model": "gpt-5", "input": "hi", "previous_response_id": 3}, "previous_response_id"),
])
def test_it_refuses_bad_input_in_openais_error_shape(gateway_url, alice_token, responses_upstream, big_profile,
                                                     body, param):
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.OBSERVE)
    answer = httpx2.post(f"{gateway_url}/responses", headers={"Authorization": f"Bearer {alice_token}"},
                         json=body, timeout=30)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]
    assert not responses_upstream.requests and not ObservedCall.objects.exists()


def test_it_refuses_an_unknown_token(gateway_url, responses_upstream, big_profile):
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.OBSERVE)
    client = OpenAI(base_url=gateway_url, api_key="not-a-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as raised:
        client.responses.create(model="gpt-5", input="hi")
    assert raised.value.code == "invalid_api_key"


@pytest.mark.parametrize("mode", [UpstreamProvider.Mode.OBSERVE, UpstreamProvider.Mode.MANAGE])
def test_it_takes_the_contextlab_token_in_the_dedicated_header(gateway_url, alice_token, responses_upstream,
                                                               big_profile, mode):
    _route(big_profile, responses_upstream, mode)
    # Codex's http_headers: the token beside whatever the client sends as its provider key.
    client = OpenAI(base_url=gateway_url, api_key="sk-users-own", max_retries=0, timeout=30,
                    default_headers={"X-ContextLab-Token": alice_token})
    assert client.responses.create(model="gpt-5", input="hi").output_text == "ok"
    # The provider stores its own key: the client's is not forwarded.
    assert responses_upstream.posts[0].headers["Authorization"] == "Bearer sk-upstream"


@pytest.mark.parametrize("mode", [UpstreamProvider.Mode.OBSERVE, UpstreamProvider.Mode.MANAGE])
def test_it_forwards_the_clients_own_key_when_the_provider_says_so(gateway_url, alice_token, responses_upstream,
                                                                   big_profile, mode):
    provider = _route(big_profile, responses_upstream, mode)
    provider.credential = UpstreamProvider.Credential.CLIENT
    provider.save()
    client = OpenAI(base_url=gateway_url, api_key="sk-users-own", max_retries=0, timeout=30,
                    default_headers={"X-ContextLab-Token": alice_token})
    assert client.responses.create(model="gpt-5", input="hi").output_text == "ok"
    assert responses_upstream.posts[0].headers["Authorization"] == "Bearer sk-users-own"
    # With the token alone there is no key of the client's to forward: refused before the provider.
    alone = OpenAI(base_url=gateway_url, api_key=alice_token, max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError, match="forwards your own provider credential"):
        alone.responses.create(model="gpt-5", input="hi")
    assert len(responses_upstream.posts) == 1


def test_it_refuses_a_profile_routed_to_an_anthropic_provider(client, responses_upstream, big_profile):
    provider = _route(big_profile, responses_upstream, UpstreamProvider.Mode.OBSERVE)
    provider.kind = UpstreamProvider.Kind.ANTHROPIC
    provider.save()
    with pytest.raises(openai.BadRequestError, match="/v1/messages"):
        client.responses.create(model="gpt-5", input="hi")
    assert not responses_upstream.requests and not ObservedCall.objects.exists()


def test_it_sends_a_websocket_attempt_back_to_http(gateway_url, alice_token):
    answer = httpx2.get(f"{gateway_url}/responses", timeout=30, headers={
        "Authorization": f"Bearer {alice_token}", "Connection": "Upgrade", "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    assert answer.status_code == 426
    assert "POST /v1/responses" in answer.json()["error"]["message"]


# -- manage mode ----------------------------------------------------------------------------------


def test_it_manages_a_responses_conversation_keeping_pairs_and_reasoning(client, responses_upstream,
                                                                         small_profile):
    """The small profile (4,000-token window) must cut: old tool outputs shrink, pairs and
    reasoning items reach the provider intact."""
    _route(small_profile, responses_upstream, UpstreamProvider.Mode.MANAGE)
    responses_upstream.responder = scripted(Reply([text("Noted.")]))
    thinking = reasoning("planning the reads")
    items: list[dict] = [{"role": "developer", "content": "You are a careful agent."},
                         {"role": "user", "content": "Read the three logs and tell me what failed."}]
    for number in range(3):
        call_id = f"call_{number}"
        items += [thinking if number == 0 else reasoning(f"step {number}"),
                  {"type": "function_call", "call_id": call_id, "name": "read_log",
                   "arguments": json.dumps({"n": number})},
                  {"type": "function_call_output", "call_id": call_id,
                   "output": f"log {number}: " + "all good. " * 400}]
    answer = client.responses.create(model="gpt-5", input=items)
    assert answer.output_text == "Noted."
    exchange = GatewayExchange.objects.get()
    assert exchange.managed and exchange.endpoint == "responses", exchange.error
    sent = responses_upstream.posts[0].body["input"]
    assert sent[0] == {"role": "developer", "content": "You are a careful agent."}
    # Reasoning travels verbatim, with its encrypted content.
    assert thinking in sent
    calls = [i["call_id"] for i in sent if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in sent if i.get("type") == "function_call_output"]
    assert calls == outputs and calls
    sizes = [len(i["output"]) for i in sent if i.get("type") == "function_call_output"]
    original = len("log 0: " + "all good. " * 400)
    assert min(sizes) < original  # the engine shortened old outputs
    session = exchange.session
    assert session is not None and session.turns_count == 1


def test_it_continues_a_managed_session_and_answers_errors_in_openais_shape(client, responses_upstream,
                                                                          big_profile):
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.MANAGE)
    responses_upstream.responder = scripted(Reply([function_call("ls", {}, call_id="call_ls")]),
                                            Reply([text("Two files.")]), Failure(503))
    question = {"role": "user", "content": "How many files are there in the folder?"}
    first = client.responses.create(model="gpt-5", input=[question], stream=False)
    items = [question, *[item.model_dump(exclude_none=True) for item in first.output],
             {"type": "function_call_output", "call_id": "call_ls", "output": "a.txt\nb.txt"}]
    with client.responses.stream(model="gpt-5", input=items) as stream:
        for _ in stream:
            pass
        assert stream.get_final_response().output_text == "Two files."
    items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Two files."}]})
    with pytest.raises(openai.APIStatusError) as raised:
        client.responses.create(model="gpt-5", input=[*items, {"role": "user", "content": "And now?"}])
    assert raised.value.status_code == 503
    exchanges = list(GatewayExchange.objects.order_by("created"))
    assert [(e.identity, e.managed, e.status_code) for e in exchanges] == [
        ("new", True, 200), ("continued", True, 200), ("continued", True, 503)]
    session = exchanges[0].session
    assert session.turns_count == 2


def test_it_manages_what_a_previous_response_id_call_carries_in_the_session_of_its_chain(
        client, responses_upstream, big_profile):
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.MANAGE)
    responses_upstream.responder = scripted(
        Reply([function_call("run_tests", {}, call_id="call_t")]), Reply([text("One test fails.")]),
        Reply([text("Fixed.")]))
    log = "".join(f"test_{i:04d} PASSED in tests/test_billing.py line {i}\n" for i in range(3_000))
    first = client.responses.create(model="gpt-5", instructions="Be brief.", input="Run the billing tests.",
                                    tools=[{"type": "function", "name": "run_tests", "parameters": {}}])
    second = client.responses.create(model="gpt-5", previous_response_id=first.id, instructions="Be brief.",
                                     input=[{"type": "function_call_output", "call_id": "call_t", "output": log}])
    client.responses.create(model="gpt-5", previous_response_id=second.id, instructions="Be brief.",
                            input="fix it")
    started, continued, fixed = GatewayExchange.objects.order_by("created")
    assert [(e.managed, e.identity) for e in (started, continued, fixed)] == [
        (True, "new"), (True, "chained"), (True, "chained")]
    # The chain resolved from what the gateway forwarded: one session, each call a turn of it.
    session = started.session
    assert continued.session == fixed.session == session
    assert (continued.turn_number, fixed.turn_number) == (2, 3)
    assert started.response_id == first.id and continued.response_id == second.id
    assert "which this session recorded" in continued.error
    assert "the provider holds the conversation before it" in continued.error
    # Only what the request carried went upstream, with the chain it continues; the engine cut the
    # large tool output as it cuts any (the provider never saw the session's earlier messages again).
    sent = responses_upstream.posts[1].body
    assert sent["previous_response_id"] == first.id
    assert [i["type"] for i in sent["input"]] == ["function_call_output"]
    assert sent["input"][0]["call_id"] == "call_t" and len(sent["input"][0]["output"]) < len(log) // 2
    assert "to read more" in sent["input"][0]["output"]
    # Kept whole by the engine, a request goes as the agent sent it: a string input stays a string.
    assert responses_upstream.posts[2].body["input"] == "fix it"
    # The call and its output paired in the session; the reply of each turn recorded.
    roles = list(session.messages.order_by("seq").values_list("role", flat=True))
    assert roles == ["user", "assistant", "tool", "assistant", "user", "assistant"]


def test_it_shows_unknown_item_types_in_the_turns_flow_and_sends_them_as_they_came(
        client, responses_upstream, big_profile):
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.MANAGE)
    mystery = {"type": "ghost_note", "id": "gn_1", "payload": {"keep": ["me", 1]}}
    items = [{"role": "user", "content": "What did the note say?"}, mystery]
    client.responses.create(model="gpt-5", input=items)
    exchange = GatewayExchange.objects.get()
    assert exchange.managed and exchange.error == ""
    assert responses_upstream.posts[0].body["input"][1] == mystery
    turn = exchange.session.turns.get()
    step = next(s for s in turn.trace["steps"] if s["step"] == "unknown_content")
    assert step["outcome"] == "kept verbatim, unread: unknown ghost_note"
    assert step["details"]["unknown"] == [{"type": "ghost_note", "at": "input[1]"}]


def test_it_sends_the_agents_own_bytes_when_the_engine_kept_the_request_whole(gateway_url, alice_token,
                                                                                responses_upstream, big_profile):
    """No conversion back into items and no re-encoding when nothing changed: what goes upstream is,
    byte for byte, what the agent sent (key order, spacing and escapes included)."""
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.MANAGE)
    sent = (b'{"input":[{"role":"user","type":"message","content":[{"type":"input_text","text":"caf\\u00e9?"}]}],'
            b'  "model":"gpt-5", "instructions":"Be brief."}')
    answer = httpx2.post(f"{gateway_url}/responses", content=sent, timeout=30,
                        headers={"Authorization": f"Bearer {alice_token}", "Content-Type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert GatewayExchange.objects.get().managed
    assert responses_upstream.posts[0].raw == sent


def test_it_says_so_when_a_managed_chain_starts_outside_contextlab(client, responses_upstream, big_profile):
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.MANAGE)
    client.responses.create(model="gpt-5", previous_response_id="resp_elsewhere", input="and then?")
    exchange = GatewayExchange.objects.get()
    assert exchange.managed and exchange.identity == "new" and exchange.session is not None
    assert "never forwarded (the chain starts outside ContextLab)" in exchange.error
    assert responses_upstream.posts[0].body["previous_response_id"] == "resp_elsewhere"
    assert responses_upstream.posts[0].body["input"] == "and then?"


@embedded_only
def test_it_relays_each_event_as_it_comes_under_daphne(tmp_path, responses_upstream):
    """Under ASGI, as deployed: events 0.3 s apart reach the client spread the same way, not all at the end."""

    responses_upstream.responder = scripted(Reply([text("one two three four five six")], pause=0.3))
    with gateway_under_daphne(tmp_path / "asgi", responses_upstream.base_url,
                              knobs={"max_input_length": 100_000}) as gateway:
        client = OpenAI(base_url=gateway.url, api_key=gateway.token, max_retries=0, timeout=30)
        arrivals = []
        with client.responses.stream(model="gpt-5", instructions="Count.", input="Count to six.") as stream:
            for event in stream:
                if event.type == "response.output_text.delta":
                    arrivals.append(time.perf_counter())
            assert stream.get_final_response().output_text == "one two three four five six"
    assert len(arrivals) == 6 and arrivals[-1] - arrivals[0] > 1.0
    assert responses_upstream.posts[0].body["input"] == "Count to six."


def test_it_ends_a_managed_stream_cut_midway_with_an_error_event(client, responses_upstream, big_profile):
    _route(big_profile, responses_upstream, UpstreamProvider.Mode.MANAGE)
    responses_upstream.responder = scripted(Reply([text("this answer never ends well")], break_after=4))
    with pytest.raises(openai.APIError, match="stream"), \
            client.responses.stream(model="gpt-5", instructions="Be brief.", input="Tell me a story.") as stream:
        for _ in stream:
            pass
    exchange = GatewayExchange.objects.get()
    assert exchange.error_stage == "upstream" and "stream" in exchange.error
    # Nothing the failed call brought joined a session: the agent's retry starts from the same state.
    assert exchange.session is None and not AgentSession.objects.exists()
