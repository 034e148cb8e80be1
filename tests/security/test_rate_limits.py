"""Issue 12, item 6: per-token request limits on the API and the gateway.

Counted in memory in embedded mode and in Redis when the suite runs in scaled
mode (REDIS_URL set), with the same assertions.
"""

from __future__ import annotations

import pytest
from django.test import Client

from contextlab.support import ratelimit


def _gateway(client: Client, token: str, path: str = "/v1/models"):
    return client.get(path, headers={"Authorization": f"Bearer {token}"})


def test_the_api_answers_429_with_retry_after_once_a_token_is_over_its_limit(api, bob_api, settings):
    settings.CONTEXTLAB_RATE_LIMIT_API = "3/3600"
    assert [api.get("/api/v1/sessions").status_code for _ in range(3)] == [200, 200, 200]
    refused = api.get("/api/v1/sessions")
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 3600
    assert "too many requests" in refused.json()["error"]
    # Per token: another token is not slowed down by this one.
    assert bob_api.get("/api/v1/sessions").status_code == 200


def test_the_gateway_answers_429_in_openais_error_shape(client, alice_token, bob_token, settings):
    settings.CONTEXTLAB_RATE_LIMIT_GATEWAY = "2/3600"
    # No upstream provider: refused with 400, but counted all the same.
    assert [_gateway(client, alice_token).status_code for _ in range(2)] == [400, 400]
    refused = client.post("/v1/chat/completions", b"{}", content_type="application/json",
                          headers={"Authorization": f"Bearer {alice_token}"})
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 3600
    body = refused.json()["error"]
    assert body["type"] == "requests" and body["code"] == "rate_limit_exceeded"
    assert "2 requests per 3600 s" in body["message"]
    assert _gateway(client, bob_token).status_code == 400


def test_a_limit_of_zero_is_no_limit(api, settings):
    settings.CONTEXTLAB_RATE_LIMIT_API = "0"
    assert {api.get("/api/v1/sessions").status_code for _ in range(20)} == {200}


def test_the_limits_are_on_by_default(settings):
    from contextlab import settings as defaults

    assert ratelimit.parse_limit(defaults.CONTEXTLAB_RATE_LIMIT_API) is not None
    assert ratelimit.parse_limit(defaults.CONTEXTLAB_RATE_LIMIT_GATEWAY) is not None


@pytest.mark.parametrize("text", ["lots", "10/x", "-1/60", "5/0"])
def test_it_refuses_a_limit_it_cannot_read(text):
    with pytest.raises(ValueError):
        ratelimit.parse_limit(text)
