"""Issue 30 item 3, the gateway's part: one rule for odd numbers and odd text, in both modes.

``Infinity``, ``NaN`` and numbers past a double (``1e400``) are refused with a
400 in OpenAI's error shape before anything is forwarded or recorded; a lone
surrogate becomes U+FFFD, and in observe mode the call is recorded and its turn
is in the rebuilt session (it used to get a 200 and then vanish).
"""

from __future__ import annotations

import json

import httpx2
import pytest

from contextlab.gateway.models import ObservedCall, UpstreamProvider
from contextlab.sessions.models import AgentProfile, AgentSession, SessionMessage, Turn
from tests.gateway.observed_calls import session_of
from tests.gateway.provider import Answer, Provider, scripted


@pytest.fixture
def observed(small_profile: AgentProfile, provider: Provider) -> UpstreamProvider:
    return UpstreamProvider.objects.create(profile=small_profile, base_url=provider.base_url, api_key="sk-up",
                                           model_map={"gpt-4o": "fake-model-2026"},
                                           mode=UpstreamProvider.Mode.OBSERVE, timeout=30)


def _post_raw(url: str, token: str, data: bytes) -> httpx2.Response:
    with httpx2.Client(timeout=30) as http:
        return http.post(f"{url}/chat/completions", content=data,
                         headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})


BAD_NUMBERS = [
    (b'"temperature": 1e400', "temperature", "1e400"),
    (b'"temperature": -1E+999', "temperature", "-1E+999"),
    (b'"top_p": NaN', "top_p", "NaN"),
    (b'"metadata": {"budget": [1, Infinity]}', "metadata.budget[1]", "Infinity"),
    (b'"frequency_penalty": -Infinity', "frequency_penalty", "-Infinity"),
]


def _body(extra: bytes, text: str = "hello") -> bytes:
    return (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": ' + json.dumps(text).encode()
            + b"}], " + extra + b"}")


@pytest.mark.parametrize(("extra", "param", "token"), BAD_NUMBERS)
def test_it_refuses_numbers_json_cannot_carry_in_manage_mode(gateway_url, alice_token, upstream, provider,
                                                             extra, param, token):
    answer = _post_raw(gateway_url, alice_token, _body(extra))
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_number"
    assert error["param"] == param
    assert f"{param} is {token}" in error["message"]
    assert provider.chat_requests == []


@pytest.mark.parametrize(("extra", "param", "token"), BAD_NUMBERS[:3])
def test_it_refuses_them_in_observe_mode_before_forwarding_or_recording(gateway_url, alice_token, observed,
                                                                        provider, extra, param, token):
    provider.responder = scripted(Answer("ok"))
    answer = _post_raw(gateway_url, alice_token, _body(extra))
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param
    assert provider.chat_requests == [] and not ObservedCall.objects.exists()
    # The agent's next, valid call goes through and is recorded.
    fine = _post_raw(gateway_url, alice_token, _body(b'"temperature": 1e300'))
    assert fine.status_code == 200
    assert ObservedCall.objects.get().status_code == 200


def test_it_keeps_the_turn_of_an_observed_call_with_a_lone_surrogate(gateway_url, alice_token, observed, provider):
    provider.responder = scripted(Answer("noted"))
    raw = _body(b'"temperature": 0.5', text="before").replace(b"before", b"before \\ud800 after")
    answer = _post_raw(gateway_url, alice_token, raw)
    assert answer.status_code == 200
    # The agent's own bytes went upstream unchanged.
    assert provider.chat_requests[-1].raw == raw
    session_id = session_of(answer)
    call = ObservedCall.objects.get()
    assert call.status_code == 200 and call.session is not None
    session = AgentSession.objects.get(pk=session_id)
    assert Turn.objects.filter(session=session).count() == 1
    texts = [json.dumps(m.content) for m in SessionMessage.objects.filter(session=session)]
    assert any("before \\ufffd after" in text for text in texts), texts


def test_it_replaces_a_lone_surrogate_in_manage_mode(gateway_url, alice_token, upstream, provider):
    provider.responder = scripted(Answer("noted"))
    raw = _body(b'"temperature": 0.5', text="x").replace(b'"x"', b'"a \\udc00 b"')
    answer = _post_raw(gateway_url, alice_token, raw)
    assert answer.status_code == 200
    sent = provider.chat_requests[-1].body
    assert sent["messages"][-1]["content"] == "a \ufffd b"


# -- what the provider answers is served as JSON or SSE only (issue 30, item 6) -----------------

HTML = b"<html><body><script>alert(document.cookie)</script>Bad gateway</body></html>"


@pytest.mark.parametrize("mode", ["manage", "observe"])
@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "application/xhtml+xml", None])
def test_it_never_serves_an_upstream_page_on_its_own_origin(gateway_url, alice_token, small_profile, provider,
                                                             mode, content_type):
    from tests.gateway.provider import Error

    UpstreamProvider.objects.create(profile=small_profile, base_url=provider.base_url, api_key="",
                                    model_map={"gpt-4o": "fake-model-2026"}, mode=mode, timeout=30)
    headers = {"Content-Type": content_type} if content_type else {}
    provider.responder = scripted(Error(502, body=HTML, headers=headers))
    answer = _post_raw(gateway_url, alice_token, _body(b'"temperature": 0.5'))
    assert answer.status_code == 502
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers.get("x-content-type-options") == "nosniff"
    error = answer.json()["error"]
    assert error["code"] == "upstream_not_json" and "<script>" in error["message"]


def test_it_still_passes_the_providers_json_error_unchanged(gateway_url, alice_token, observed, provider):
    from tests.gateway.provider import Error

    provider.responder = scripted(Error(429))
    answer = _post_raw(gateway_url, alice_token, _body(b'"temperature": 0.5'))
    assert answer.status_code == 429 and answer.content == Error(429).body
    assert answer.headers["content-type"] == "application/json"
