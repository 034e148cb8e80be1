"""The gateway's tables in the admin: providers are configured there, calls are read there."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from contextlab.gateway.models import GatewayExchange, UpstreamProvider


@pytest.fixture
def root(db) -> Client:
    browser = Client()
    browser.force_login(User.objects.create_superuser("root", "root@example.org", "pw"))
    return browser


def _form(profile, **values):
    return {"profile": profile.pk, "base_url": "https://llm.example/v1", "api_key_env": "", "api_key": "",
            "model_map": "{}", "timeout": 60, "extra_headers": "{}", "identity": "system+first_user", "mode": "manage",
            **values}


def test_it_adds_a_provider_and_never_shows_its_key_again(root, small_profile):
    response = root.post("/admin/gateway/upstreamprovider/add/", _form(small_profile, api_key="sk-secret",
                                                                        model_map='{"gpt-4o": "deploy-1"}'))
    assert response.status_code == 302, response.content.decode()[:2000]
    provider = UpstreamProvider.objects.get()
    assert (provider.resolve_api_key(), provider.model_map) == ("sk-secret", {"gpt-4o": "deploy-1"})
    assert "sk-secret" not in provider.api_key  # stored encrypted
    change = root.get(f"/admin/gateway/upstreamprovider/{provider.pk}/change/")
    assert change.status_code == 200 and "sk-secret" not in change.content.decode()

    # Saved again without typing the key: it stays. The checkbox removes it.
    root.post(f"/admin/gateway/upstreamprovider/{provider.pk}/change/", _form(small_profile, timeout=30))
    provider.refresh_from_db()
    assert (provider.resolve_api_key(), provider.timeout) == ("sk-secret", 30)
    root.post(f"/admin/gateway/upstreamprovider/{provider.pk}/change/", _form(small_profile, clear_api_key="on"))
    provider.refresh_from_db()
    assert provider.api_key == ""
    assert "none" in root.get("/admin/gateway/upstreamprovider/").content.decode()


def test_it_refuses_a_model_map_that_is_not_names(root, small_profile):
    response = root.post("/admin/gateway/upstreamprovider/add/", _form(small_profile, model_map='{"a": 1}'))
    assert response.status_code == 200 and "an object of model names" in response.content.decode()
    assert not UpstreamProvider.objects.exists()


def test_it_lists_gateway_sessions_and_calls(root, openai_client):
    openai_client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    for page in ("gatewaysession", "gatewayexchange"):
        listing = root.get(f"/admin/gateway/{page}/")
        assert listing.status_code == 200, page
    assert root.get(f"/admin/gateway/gatewayexchange/{GatewayExchange.objects.get().pk}/change/").status_code == 200


def test_it_sets_a_providers_kind_and_whose_credential_goes_upstream(root, small_profile):
    response = root.post("/admin/gateway/upstreamprovider/add/", _form(
        small_profile, base_url="https://api.anthropic.com/v1", kind="anthropic", credential="client",
        context_edits="engine"))
    assert response.status_code == 302, response.content.decode()[:2000]
    provider = UpstreamProvider.objects.get()
    assert (provider.kind, provider.credential, provider.context_edits) == ("anthropic", "client", "engine")
    assert provider.forwards_client_credential
    refused = root.post(f"/admin/gateway/upstreamprovider/{provider.pk}/change/", _form(small_profile, kind="grpc"))
    assert refused.status_code == 200 and "Select a valid choice" in refused.content.decode()
