"""A managed Responses call costs what a chat completion costs: the same SQL statements, at 100 and
1,000 items, as the chat completion of the same conversation."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from contextlab.gateway import lookups
from contextlab.gateway import services as gateway_services
from contextlab.gateway.models import UpstreamProvider
from contextlab.sessions import services
from tests.gateway.provider import Answer, Provider
from tests.gateway.responses_upstream import Reply, ResponsesUpstream, text

pytestmark = pytest.mark.django_db(transaction=True)

REPLY = "Built; the warnings in /srv/shop/build.log are unchanged."


def _items(size: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for turn in range(size // 2):
        items += [{"role": "user", "content": f"[{size}] build t{turn}"},
                  {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": REPLY}]}]
    return items


def _statements(client: Client, token: str, path: str, body: dict[str, Any], grow: Any) -> list[str]:
    def call() -> Any:
        grow(body)
        response = client.post(path, json.dumps(body), content_type="application/json",
                               headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 200, response.content[:300]
        assert response["X-ContextLab-Managed"] == "true"
        return response

    call()  # ingests the conversation
    call()  # this process now keeps its engine and digests
    with CaptureQueriesContext(connection) as queries:
        call()
    return [q["sql"].split(" ", 1)[0] for q in queries.captured_queries]


def _next_item(body: dict[str, Any]) -> None:
    items = body["input"]
    if items and items[-1].get("role") == "user":
        items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": REPLY}]})
    items.append({"role": "user", "content": f"Next ({len(items)})."})


def _next_message(body: dict[str, Any]) -> None:
    messages = body["messages"]
    if messages[-1]["role"] == "user":
        messages.append({"role": "assistant", "content": REPLY})
    messages.append({"role": "user", "content": f"Next ({len(messages)})."})


def test_it_records_a_responses_call_in_the_statements_of_a_chat_completion(alice: User, alice_token: str,
                                                                           monkeypatch: pytest.MonkeyPatch):
    # What a call costs, not when the caches expire: on a busy machine a call can outlast the
    # lookups' lifetime or the token's last-used resolution, and add their statements to one side.
    monkeypatch.setattr(lookups, "TTL", 3600.0)
    monkeypatch.setattr(gateway_services, "LAST_USED_RESOLUTION", datetime.timedelta(days=1))
    responses_profile = services.profile_create(owner=alice, name="responses", knobs={"max_input_length": 10_000_000})
    chat_profile = services.profile_create(owner=alice, name="chat", knobs={"max_input_length": 10_000_000})
    client = Client()
    with ResponsesUpstream(lambda request: Reply([text(REPLY)])) as upstream, \
            Provider(lambda body: Answer(REPLY)) as provider:
        UpstreamProvider.objects.create(profile=responses_profile, base_url=upstream.base_url, api_key="sk-up",
                                        timeout=30)
        UpstreamProvider.objects.create(profile=chat_profile, base_url=provider.base_url, api_key="sk-up",
                                        timeout=30)
        responses: dict[int, list[str]] = {}
        chat: dict[int, list[str]] = {}
        for size in (100, 1_000):
            client.defaults["HTTP_X_CONTEXTLAB_PROFILE"] = "responses"
            responses[size] = _statements(client, alice_token, "/v1/responses", {
                "model": "gpt-5", "instructions": "You are a build engineer.", "input": _items(size)}, _next_item)
            client.defaults["HTTP_X_CONTEXTLAB_PROFILE"] = "chat"
            messages = [{"role": m["role"], "content": m["content"] if m["role"] == "user" else REPLY}
                        for m in _items(size)]
            chat[size] = _statements(client, alice_token, "/v1/chat/completions", {"model": "gpt-5", "messages": [
                {"role": "system", "content": "You are a build engineer."}, *messages]}, _next_message)
    assert responses[100] == responses[1_000]
    assert responses[1_000] == chat[1_000]
