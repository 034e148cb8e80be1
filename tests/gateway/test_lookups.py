"""A call's token, profile and provider are looked up once and kept briefly; a change made in
this process is seen by the very next call."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from contextlab.api.models import ApiToken
from contextlab.gateway import lookups
from contextlab.gateway.models import UpstreamProvider
from contextlab.sessions import services
from tests.gateway.provider import Answer, Provider

pytestmark = pytest.mark.django_db(transaction=True)

LOOKUP_TABLES = ("api_apitoken", "contextlab_sessions_agentprofile", "gateway_upstreamprovider")


def _post(client: Client, token: str, messages: list[dict[str, Any]]) -> Any:
    return client.post("/v1/chat/completions", json.dumps({"model": "gpt-4o", "messages": messages}),
                       content_type="application/json", headers={"Authorization": f"Bearer {token}"})


def _lookups(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries
            if q["sql"].startswith("SELECT") and any(f'FROM "{t}"' in q["sql"] for t in LOOKUP_TABLES)]


def test_it_looks_up_the_token_profile_and_provider_once_for_back_to_back_calls(alice: User, alice_token: str):
    profile = services.profile_create(owner=alice, name="wide", knobs={"max_input_length": 1_000_000})
    with Provider(lambda body: Answer("Done.")) as provider:
        UpstreamProvider.objects.create(profile=profile, base_url=provider.base_url, api_key="", timeout=30)
        client = Client()
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Build it."}]
        assert _post(client, alice_token, messages).status_code == 200
        messages += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Again."}]
        with CaptureQueriesContext(connection) as queries:
            response = _post(client, alice_token, messages)
    assert response.status_code == 200
    assert response["X-ContextLab-Managed"] == "true"
    assert _lookups(queries) == []


def test_it_keeps_the_provider_until_this_process_changes_it(alice: User, alice_token: str):
    profile = services.profile_create(owner=alice, name="wide", knobs={"max_input_length": 1_000_000})
    with Provider(lambda body: Answer("From the first.")) as first, \
            Provider(lambda body: Answer("From the second.")) as second:
        upstream = UpstreamProvider.objects.create(profile=profile, base_url=first.base_url, api_key="", timeout=30)
        client = Client()
        assert _post(client, alice_token, [{"role": "user", "content": "Hi."}]).status_code == 200
        with CaptureQueriesContext(connection) as queries:
            assert _post(client, alice_token, [{"role": "user", "content": "Hello."}]).status_code == 200
        assert _lookups(queries) == []
        upstream.base_url = second.base_url
        upstream.save()
        response = _post(client, alice_token, [{"role": "user", "content": "Hi again."}])
        assert json.loads(response.content)["choices"][0]["message"]["content"] == "From the second."
        assert len(first.requests) == 2 and len(second.requests) == 1


def test_it_keeps_the_token_until_this_process_deletes_it(alice: User, alice_token: str):
    profile = services.profile_create(owner=alice, name="wide", knobs={"max_input_length": 1_000_000})
    with Provider(lambda body: Answer("Done.")) as provider:
        UpstreamProvider.objects.create(profile=profile, base_url=provider.base_url, api_key="", timeout=30)
        client = Client()
        assert _post(client, alice_token, [{"role": "user", "content": "Hi."}]).status_code == 200
        with CaptureQueriesContext(connection) as queries:
            assert _post(client, alice_token, [{"role": "user", "content": "Hello."}]).status_code == 200
        assert _lookups(queries) == []
        ApiToken.objects.filter(user=alice).delete()
        assert _post(client, alice_token, [{"role": "user", "content": "Hi."}]).status_code == 401


def test_it_forgets_what_it_kept_after_the_ttl(alice: User, alice_token: str, monkeypatch: pytest.MonkeyPatch):
    loads: list[int] = []

    def load() -> int:
        loads.append(1)
        return len(loads)

    assert lookups.kept(("test",), load) == 1
    assert lookups.kept(("test",), load) == 1
    # Another process's change (which sends this process no signal) is seen once the entry is too old.
    monkeypatch.setattr(lookups, "TTL", 0.0)
    assert lookups.kept(("test",), load) == 2
