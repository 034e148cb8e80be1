"""Chat completions take the ContextLab token as the other endpoints do (issue 25, credentials).

The token may come in the dedicated ``X-ContextLab-Token`` header beside the
client's own provider key, and a provider set to forward the client's key sends
that key upstream instead of its stored one, in both modes.
"""

from __future__ import annotations

import openai
import pytest
from openai import OpenAI

from contextlab.gateway.models import UpstreamProvider
from tests.gateway.conftest import UPSTREAM_KEY
from tests.gateway.provider import Provider

ASK = [{"role": "user", "content": "hello"}]


def _client(gateway_url: str, api_key: str, token: str | None = None) -> OpenAI:
    headers = {"X-ContextLab-Token": token} if token else {}
    return OpenAI(base_url=gateway_url, api_key=api_key, max_retries=0, timeout=30, default_headers=headers)


@pytest.mark.parametrize("mode", [UpstreamProvider.Mode.OBSERVE, UpstreamProvider.Mode.MANAGE])
def test_it_takes_the_token_in_the_dedicated_header(gateway_url, alice_token, upstream, provider: Provider, mode):
    upstream.mode = mode
    upstream.save()
    _client(gateway_url, "sk-users-own", alice_token).chat.completions.create(model="gpt-4o", messages=ASK)
    # The provider keeps its stored key: the client's own is not forwarded.
    assert provider.requests[-1].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"


@pytest.mark.parametrize("mode", [UpstreamProvider.Mode.OBSERVE, UpstreamProvider.Mode.MANAGE])
def test_it_forwards_the_clients_own_key_when_the_provider_says_so(gateway_url, alice_token, upstream,
                                                                   provider: Provider, mode):
    upstream.mode = mode
    upstream.credential = UpstreamProvider.Credential.CLIENT
    upstream.save()
    _client(gateway_url, "sk-users-own", alice_token).chat.completions.create(model="gpt-4o", messages=ASK)
    assert provider.requests[-1].headers["authorization"] == "Bearer sk-users-own"
    sent = len(provider.requests)
    # The token alone carries no key of the client's: refused before the provider is called.
    with pytest.raises(openai.AuthenticationError, match="forwards your own provider credential"):
        _client(gateway_url, alice_token).chat.completions.create(model="gpt-4o", messages=ASK)
    assert len(provider.requests) == sent


def test_it_refuses_a_profile_routed_to_an_anthropic_provider(gateway_url, alice_token, upstream,
                                                             provider: Provider):
    upstream.kind = UpstreamProvider.Kind.ANTHROPIC
    upstream.save()
    with pytest.raises(openai.BadRequestError, match="/v1/messages"):
        _client(gateway_url, alice_token).chat.completions.create(model="gpt-4o", messages=ASK)
    assert not provider.requests


# -- the token is never taken for the client's own provider key ---------------------------------

@pytest.mark.parametrize("headers", [
    {"X-ContextLab-Token": "{token}", "Authorization": "Bearer {token}"},
    {"x-api-key": "{token}", "Authorization": "Bearer {token}"},
    {"X-ContextLab-Token": "{token}", "x-api-key": "{token}"},
])
def test_it_never_forwards_the_token_sent_twice(alice_token, headers):
    from contextlab.gateway import credentials

    resolved = credentials.resolve({k: v.format(token=alice_token) for k, v in headers.items()})
    assert resolved.token is not None
    assert resolved.provider_credential is None


def test_it_forwards_the_clients_key_sent_beside_the_token(alice_token):
    from contextlab.gateway import credentials

    resolved = credentials.resolve({"X-ContextLab-Token": alice_token, "x-api-key": alice_token,
                                    "Authorization": "Bearer sk-users-own"})
    assert resolved.provider_credential is not None
    assert resolved.provider_credential.value == "Bearer sk-users-own"


# -- /v1/models takes the token as the other endpoints do ---------------------------------------

def test_it_lists_models_with_the_token_in_the_dedicated_header(gateway_url, alice_token, upstream,
                                                                provider: Provider):
    upstream.credential = UpstreamProvider.Credential.CLIENT
    upstream.save()
    _client(gateway_url, "sk-users-own", alice_token).models.list()
    assert provider.requests[-1].headers["authorization"] == "Bearer sk-users-own"


def test_it_never_serves_a_protocols_extra_content_type():
    import httpx2

    from contextlab.gateway import upstream as gateway_upstream

    answer = httpx2.Response(200, headers={"content-type": "text/html"}, content=b"<script>alert(1)</script>")
    response = gateway_upstream.passthrough(answer, answer.content, extra={"Content-Type": "text/html",
                                                                          "request-id": "req_1"})
    assert response["Content-Type"] == "application/json"
    assert response["request-id"] == "req_1"
