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


# -- the trust boundary of the provider admin (issue 30, item 6) -------------------------------

METADATA_URLS = ["http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/v1",
                 "http://metadata.google.internal/computeMetadata/v1", "http://[fe80::1]:8080/v1",
                 "http://[::ffff:169.254.169.254]/v1", "http://100.100.100.200/v1"]


@pytest.fixture
def staff(db) -> Client:
    """A staff member who is not a superuser, allowed to manage providers."""
    from django.contrib.auth.models import Permission

    user = User.objects.create_user("staffer", "staff@example.org", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__endswith="upstreamprovider"))
    browser = Client()
    browser.force_login(user)
    return browser


@pytest.mark.parametrize("url", METADATA_URLS)
def test_it_refuses_a_link_local_or_metadata_provider(staff, small_profile, url):
    response = staff.post("/admin/gateway/upstreamprovider/add/", _form(small_profile, base_url=url))
    assert response.status_code == 200
    assert "link-local or cloud-metadata address" in response.content.decode()
    assert not UpstreamProvider.objects.exists()


def test_the_operator_can_allow_a_link_local_provider(staff, small_profile, settings):
    settings.CONTEXTLAB_ALLOW_LINK_LOCAL_UPSTREAMS = True
    response = staff.post("/admin/gateway/upstreamprovider/add/",
                          _form(small_profile, base_url="http://169.254.10.20:8000/v1"))
    assert response.status_code == 302
    assert UpstreamProvider.objects.get().base_url == "http://169.254.10.20:8000/v1"


@pytest.mark.parametrize("name", ["SECRET_KEY", "DATABASE_URL", "OPENAI_API_KEY", "CONTEXTLAB_UPSTREAM_",
                                  "contextlab_upstream_key", "CONTEXTLAB_UPSTREAM_KEY;rm"])
def test_it_refuses_a_key_variable_outside_the_prefix(staff, small_profile, name):
    response = staff.post("/admin/gateway/upstreamprovider/add/", _form(small_profile, api_key_env=name))
    assert response.status_code == 200
    assert "starts with CONTEXTLAB_UPSTREAM_" in response.content.decode()
    assert not UpstreamProvider.objects.exists()


def test_it_takes_a_key_variable_with_the_prefix(staff, small_profile, monkeypatch):
    monkeypatch.setenv("CONTEXTLAB_UPSTREAM_OPENAI_KEY", "sk-env")
    response = staff.post("/admin/gateway/upstreamprovider/add/",
                          _form(small_profile, api_key_env="CONTEXTLAB_UPSTREAM_OPENAI_KEY"))
    assert response.status_code == 302
    assert UpstreamProvider.objects.get().resolve_api_key() == "sk-env"


def test_a_stored_name_outside_the_prefix_is_never_read(small_profile, monkeypatch):
    from contextlab.gateway.models import UpstreamMisconfigured

    monkeypatch.setenv("SECRET_KEY", "the-servers-own-secret")
    row = UpstreamProvider.objects.create(profile=small_profile, base_url="https://llm.example/v1",
                                          api_key_env="SECRET_KEY")
    with pytest.raises(UpstreamMisconfigured):
        row.resolve_api_key()


def test_the_migration_gives_existing_key_variables_the_prefix(small_profile):
    from importlib import import_module

    from django.apps import apps

    migration = import_module("contextlab.gateway.migrations.0008_upstream_key_variable_prefix")
    old = UpstreamProvider.objects.create(profile=small_profile, base_url="https://llm.example/v1",
                                          api_key_env="OPENAI_API_KEY")
    migration.add_prefix(apps, None)
    old.refresh_from_db()
    assert old.api_key_env == "CONTEXTLAB_UPSTREAM_OPENAI_API_KEY"
    migration.add_prefix(apps, None)  # idempotent
    old.refresh_from_db()
    assert old.api_key_env == "CONTEXTLAB_UPSTREAM_OPENAI_API_KEY"


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
