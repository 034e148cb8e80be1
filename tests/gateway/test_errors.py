"""Failures: the provider's errors pass through untouched; ContextLab's own never reach the agent."""

from __future__ import annotations

import json
import socket

import httpx2
import openai
import pytest
from openai import OpenAI

from contextlab.gateway.models import GatewayExchange
from contextlab.sessions.models import AgentSession
from tests.gateway.provider import Answer, Error, scripted

SYSTEM = {"role": "system", "content": "You are a build agent."}
ASK = {"role": "user", "content": "Build it."}
PROVIDER_ERROR = (b'{\n  "error": {\n    "message": "This model\'s maximum context length is 8192 tokens.",\n'
                  b'    "type": "invalid_request_error",\n    "param": "messages",\n'
                  b'    "code": "context_length_exceeded"\n  }\n}\n')


def _post(url: str, token: str, body: dict, **headers: str) -> httpx2.Response:
    with httpx2.Client(timeout=30) as http:
        return http.post(f"{url}/chat/completions", json=body, headers={"Authorization": f"Bearer {token}", **headers})


def test_it_refuses_a_bad_token_in_openais_shape(gateway_url, upstream, provider):
    client = OpenAI(base_url=gateway_url, api_key="cl_not-a-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=[ASK])
    assert caught.value.status_code == 401
    assert caught.value.body["code"] == "invalid_api_key" and caught.value.body["type"] == "invalid_request_error"
    with httpx2.Client() as http:
        assert http.post(f"{gateway_url}/chat/completions", json={}).status_code == 401
        assert http.get(f"{gateway_url}/models").status_code == 401
    assert provider.requests == [] and not GatewayExchange.objects.exists()


@pytest.mark.parametrize("status", [400, 404, 422, 429, 500, 503])
@pytest.mark.parametrize("stream", [False, True])
def test_it_passes_upstream_errors_through_unchanged(gateway_url, alice_token, upstream, provider, status, stream):
    headers = {"Content-Type": "application/json; charset=utf-8", "retry-after": "7", "x-request-id": "req-err"}
    provider.responder = lambda body: Error(status, PROVIDER_ERROR, headers)
    response = _post(gateway_url, alice_token, {"model": "gpt-4o", "messages": [SYSTEM, ASK], "stream": stream})
    assert response.status_code == status
    assert response.content == PROVIDER_ERROR
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    assert response.headers["retry-after"] == "7" and response.headers["x-request-id"] == "req-err"
    exchange = GatewayExchange.objects.get()
    assert (exchange.status_code, exchange.managed, exchange.error) == (status, True, "")
    # Nothing was answered, so nothing joins a session: not even the new one this call would have started.
    assert exchange.session is None and exchange.turn_number is None
    assert not AgentSession.objects.exists()


def test_sdk_retries_of_a_refused_call_add_one_turn_once_the_provider_answers(openai_client, provider):
    first = openai_client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, ASK])
    session = AgentSession.objects.get()
    follow_up = [SYSTEM, ASK, {"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Now run the tests."}]
    refusal = Error(429, PROVIDER_ERROR, {"Content-Type": "application/json", "retry-after": "0"})
    provider.responder = scripted(refusal, refusal, Answer("Tests pass."))
    reply = openai_client.with_options(max_retries=2).chat.completions.create(model="gpt-4o", messages=follow_up)
    assert reply.choices[0].message.content == "Tests pass."
    # The SDK sent the call three times; the session took it once.
    assert len(provider.chat_requests) == 4
    assert [e.status_code for e in GatewayExchange.objects.order_by("pk")] == [200, 429, 429, 200]
    session.refresh_from_db()
    assert session.turns_count == 2
    assert list(session.messages.order_by("seq").values_list("role", flat=True)) == [
        "user", "assistant", "user", "assistant"]
    # Each attempt went upstream with the same managed payload.
    assert provider.chat_requests[1].body["messages"] == provider.chat_requests[3].body["messages"]


def test_a_refused_call_leaves_a_running_session_as_it_was(openai_client, provider):
    openai_client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, ASK])
    session = AgentSession.objects.get()
    before = (session.turns_count, session.messages_count, session.engine_state)
    provider.responder = lambda body: Error(503, PROVIDER_ERROR)
    with pytest.raises(openai.InternalServerError):
        openai_client.with_options(max_retries=0).chat.completions.create(
            model="gpt-4o", messages=[SYSTEM, ASK, {"role": "assistant", "content": "ok"},
                                      {"role": "user", "content": "And deploy."}])
    session.refresh_from_db()
    assert (session.turns_count, session.messages_count, session.engine_state) == before
    assert GatewayExchange.objects.order_by("pk").last().session_id == session.pk


def test_the_openai_client_sees_the_providers_error(openai_client, provider):
    provider.responder = lambda body: Error(400, PROVIDER_ERROR)
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(model="gpt-4o", messages=[ASK])
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.message.startswith("Error code: 400 - ")
    assert "maximum context length is 8192 tokens" in caught.value.message


def test_it_forwards_unmanaged_when_contextlab_cannot_take_the_messages(openai_client, provider):
    # PostgreSQL cannot store NUL, so ContextLab refuses it; the provider may not.
    messages = [SYSTEM, {"role": "user", "content": "binary output: \x00\x01 end"}]
    reply = openai_client.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
    assert reply.parse().choices[0].message.content == "ok"
    assert reply.headers["X-ContextLab-Managed"] == "false"
    assert provider.chat_requests[-1].body == {"model": "fake-model-2026", "messages": messages}
    exchange = GatewayExchange.objects.get()
    assert (exchange.managed, exchange.error_stage, exchange.session, exchange.status_code) == \
        (False, "hook", None, 200)
    assert "NUL character" in exchange.error
    assert not AgentSession.objects.exists()  # the session started for the call went with the failure


def test_it_forwards_unmanaged_when_the_engine_breaks(openai_client, provider, settings, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("the workspaces folder cannot be created here")
    settings.WORKSPACES_DIR = blocker / "workspaces"
    messages = [SYSTEM, ASK]
    assert openai_client.chat.completions.create(model="gpt-4o", messages=messages).choices[0].message.content == "ok"
    assert provider.chat_requests[-1].body["messages"] == messages
    exchange = GatewayExchange.objects.get()
    assert not exchange.managed and exchange.error_stage == "hook" and exchange.session is None
    assert "NotADirectoryError" in exchange.error or "FileExistsError" in exchange.error


def test_a_failure_in_a_running_session_is_counted_on_it(openai_client, provider):
    messages = [SYSTEM, ASK]
    reply = openai_client.chat.completions.create(model="gpt-4o", messages=messages).choices[0].message
    # An orphan tool result: the engine refuses it; the provider gets the call as sent and decides.
    broken = [*messages, {"role": "assistant", "content": reply.content},
              {"role": "tool", "tool_call_id": "call_nowhere", "content": "?"}]
    openai_client.chat.completions.create(model="gpt-4o", messages=broken)
    assert provider.chat_requests[-1].body["messages"] == broken
    session = AgentSession.objects.get()
    assert session.failures_count == 1 and session.turns_count == 1
    failed = GatewayExchange.objects.order_by("-created").first()
    assert (failed.session, failed.managed, failed.error_stage) == (session, False, "hook")
    assert "orphan tool result" in failed.error
    # Listed under "had a failure" on the sessions page.
    assert list(AgentSession.objects.listed(failed=True)) == [session]


def test_it_answers_for_an_unreachable_provider(openai_client, upstream):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    upstream.base_url = f"http://127.0.0.1:{port}/v1"
    upstream.save()
    with pytest.raises(openai.InternalServerError) as caught:
        openai_client.chat.completions.create(model="gpt-4o", messages=[ASK])
    assert caught.value.status_code == 502 and caught.value.body["code"] == "upstream_unreachable"
    exchange = GatewayExchange.objects.get()
    assert exchange.status_code == 502 and exchange.error_stage == "upstream"


def test_it_answers_for_a_provider_that_times_out(openai_client, provider, upstream):
    upstream.timeout = 1.0
    upstream.save()
    provider.responder = lambda body: Answer("late", delay=3.0)
    with pytest.raises(openai.APIStatusError) as caught:
        openai_client.chat.completions.create(model="gpt-4o", messages=[ASK])
    assert caught.value.status_code == 504 and caught.value.body["code"] == "upstream_timeout"
    exchange = GatewayExchange.objects.get()
    assert exchange.status_code == 504 and "did not answer within 1 s" in exchange.error


def test_it_ends_a_stream_the_provider_abandons_and_records_why(openai_client, provider, upstream):
    upstream.timeout = 1.0
    upstream.save()
    provider.responder = lambda body: Answer("a long answer that stalls", chunk_delay=3.0)
    chunks = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in openai_client.chat.completions.create(model="gpt-4o", messages=[ASK], stream=True):
            chunks.append(chunk)
    assert len(chunks) == 1  # the first event came, then the provider went quiet
    assert caught.value.body["code"] == "upstream_stream_broken" and "broke off" in caught.value.message
    exchange = GatewayExchange.objects.get()
    assert exchange.error_stage == "upstream" and "broke off" in exchange.error
    # Neither the half reply nor the question joins: the client saw an error and may ask again.
    assert not AgentSession.objects.exists()


def test_a_stream_the_provider_drops_midway_raises_in_the_openai_client(openai_client, provider):
    provider.responder = lambda body: Answer("an answer cut in the middle of the body", break_after=3)
    received = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in openai_client.chat.completions.create(model="gpt-4o", messages=[ASK], stream=True):
            received.append(chunk.choices[0].delta.content or "")
    # What came before the break was passed on; the break itself is an exception, not an end.
    assert len(received) == 3 and caught.value.body["code"] == "upstream_stream_broken"
    exchange = GatewayExchange.objects.get()
    assert exchange.error_stage == "upstream" and "broke off" in exchange.error
    assert not AgentSession.objects.exists()


def test_it_says_clearly_when_the_profile_has_no_provider(openai_client, upstream):
    upstream.delete()
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(model="gpt-4o", messages=[ASK])
    assert caught.value.body["code"] == "contextlab_no_upstream"
    assert "Upstream providers" in caught.value.message


def test_it_says_the_providers_key_is_missing_without_naming_the_variable(openai_client, upstream, monkeypatch):
    monkeypatch.delenv("CONTEXTLAB_UPSTREAM_TEST_MISSING_KEY", raising=False)
    upstream.api_key_env = "CONTEXTLAB_UPSTREAM_TEST_MISSING_KEY"
    upstream.save()
    with pytest.raises(openai.InternalServerError) as caught:
        openai_client.with_options(max_retries=0).chat.completions.create(model="gpt-4o", messages=[ASK])
    assert caught.value.body["code"] == "contextlab_upstream_misconfigured"
    assert "no API key configured" in caught.value.message
    # Which variables the server reads (and so which secrets exist) is the operator's business.
    assert "CONTEXTLAB_UPSTREAM_TEST_MISSING_KEY" not in caught.value.message
    assert "environment variable" not in caught.value.message


def test_it_reads_the_key_from_the_environment(openai_client, upstream, provider, monkeypatch):
    monkeypatch.setenv("CONTEXTLAB_UPSTREAM_TEST_KEY", "sk-from-env")
    upstream.api_key_env = "CONTEXTLAB_UPSTREAM_TEST_KEY"
    upstream.save()
    openai_client.chat.completions.create(model="gpt-4o", messages=[ASK])
    assert provider.chat_requests[-1].headers["authorization"] == "Bearer sk-from-env"


def test_it_refuses_what_is_not_a_chat_request(gateway_url, alice_token, upstream, provider):
    with httpx2.Client(timeout=30) as http:
        auth = {"Authorization": f"Bearer {alice_token}"}
        bad_json = http.post(f"{gateway_url}/chat/completions", content=b"{not json", headers=auth)
        assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "invalid_json"
        wrong_method = http.get(f"{gateway_url}/chat/completions", headers=auth)
        assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
        unknown = http.post(f"{gateway_url}/embeddings", json={}, headers=auth)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_url"
    assert provider.requests == []


def test_it_leaves_it_to_the_provider_to_judge_a_request_without_messages(gateway_url, alice_token, upstream,
                                                                          provider):
    provider.responder = lambda body: Error(400, json.dumps({"error": {"message": "messages is required"}}).encode())
    response = _post(gateway_url, alice_token, {"model": "gpt-4o"})
    assert response.status_code == 400 and response.json() == {"error": {"message": "messages is required"}}
    assert provider.chat_requests[-1].body == {"model": "fake-model-2026"}
    assert GatewayExchange.objects.get().error_stage == "identity"


def test_a_client_retry_after_its_timeout_replaces_the_reply_it_never_received(gateway_url, alice_token,
                                                                              openai_client, provider):
    first = openai_client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, ASK])
    follow_up = [SYSTEM, ASK, {"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Now run the tests."}]
    provider.responder = scripted(Answer("an answer nobody waited for", delay=1.5), Answer("Tests pass."))
    body = {"model": "gpt-4o", "messages": follow_up}
    auth = {"Authorization": f"Bearer {alice_token}"}
    # The client gives up after 0.5 s; the gateway still gets and records that answer. Then it
    # retries as the SDKs do, counting the retry (this test server takes one request at a time,
    # so the retry is served once the first call is recorded).
    with pytest.raises(httpx2.TimeoutException), httpx2.Client(timeout=0.5) as impatient:
        impatient.post(f"{gateway_url}/chat/completions", json=body, headers=auth)
    with httpx2.Client(timeout=30) as http:
        retried = http.post(f"{gateway_url}/chat/completions", json=body,
                            headers={**auth, "X-Stainless-Retry-Count": "1"}).json()
    assert retried["choices"][0]["message"]["content"] == "Tests pass."
    # One conversation, one turn for the call, and the reply the client took is the one recorded.
    session = AgentSession.objects.get()
    assert session.turns_count == 2
    assert [(m.role, m.content[0]["text"]) for m in session.messages.order_by("seq")][-2:] == [
        ("user", "Now run the tests."), ("assistant", "Tests pass.")]
    assert list(GatewayExchange.objects.order_by("pk").values_list("identity", flat=True)) == [
        "new", "continued", "repeated"]
    assert GatewayExchange.objects.order_by("pk").last().turn_number == 2
    # The repeat sent the turn's payload again, unchanged.
    assert provider.chat_requests[1].body["messages"] == provider.chat_requests[2].body["messages"]
    # The conversation goes on in the same session.
    openai_client.chat.completions.create(model="gpt-4o", messages=[
        *follow_up, {"role": "assistant", "content": "Tests pass."}, {"role": "user", "content": "Ship it."}])
    assert AgentSession.objects.get().turns_count == 3
