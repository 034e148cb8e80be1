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
from tests.gateway.provider import Answer, Error

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
    # Nothing was answered, so nothing joins the session; the turn has no usage.
    session = AgentSession.objects.get()
    assert list(session.messages.values_list("role", flat=True)) == ["user"]


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
    assert not exchange.managed and exchange.error_stage == "identity"
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
    chunks = list(openai_client.chat.completions.create(model="gpt-4o", messages=[ASK], stream=True))
    assert len(chunks) == 1  # the first event came, then the provider went quiet
    exchange = GatewayExchange.objects.get()
    assert exchange.error_stage == "upstream" and "broke off" in exchange.error
    # The half reply is not recorded: the client never received it whole.
    assert list(AgentSession.objects.get().messages.values_list("role", flat=True)) == ["user"]


def test_it_says_clearly_when_the_profile_has_no_provider(openai_client, upstream):
    upstream.delete()
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(model="gpt-4o", messages=[ASK])
    assert caught.value.body["code"] == "contextlab_no_upstream"
    assert "Upstream providers" in caught.value.message


def test_it_says_the_providers_key_is_missing_without_naming_the_variable(openai_client, upstream, monkeypatch):
    monkeypatch.delenv("CONTEXTLAB_TEST_MISSING_KEY", raising=False)
    upstream.api_key_env = "CONTEXTLAB_TEST_MISSING_KEY"
    upstream.save()
    with pytest.raises(openai.InternalServerError) as caught:
        openai_client.with_options(max_retries=0).chat.completions.create(model="gpt-4o", messages=[ASK])
    assert caught.value.body["code"] == "contextlab_upstream_misconfigured"
    assert "no API key configured" in caught.value.message
    # Which variables the server reads (and so which secrets exist) is the operator's business.
    assert "CONTEXTLAB_TEST_MISSING_KEY" not in caught.value.message
    assert "environment variable" not in caught.value.message


def test_it_reads_the_key_from_the_environment(openai_client, upstream, provider, monkeypatch):
    monkeypatch.setenv("CONTEXTLAB_TEST_KEY", "sk-from-env")
    upstream.api_key_env = "CONTEXTLAB_TEST_KEY"
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
