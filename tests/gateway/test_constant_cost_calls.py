"""A gateway call's bookkeeping does not grow with the conversation: the same SQL statements
at 100 and 1,000 live messages, and a gateway row of the same size."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from contextlab.gateway import history
from contextlab.gateway.models import GatewaySession, UpstreamProvider
from contextlab.sessions import services
from tests.gateway.provider import Answer, Provider

pytestmark = pytest.mark.django_db(transaction=True)

REPLY = "Built; the warnings in /srv/shop/build.log are unchanged."


def _conversation(size: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a build engineer."}]
    for turn in range(size // 2):
        messages += [{"role": "user", "content": f"[{size}] build t{turn}"}, {"role": "assistant", "content": REPLY}]
    return messages


def _call(client: Client, token: str, messages: list[dict[str, Any]]) -> Any:
    messages.append({"role": "user", "content": f"Next ({len(messages)})."})
    response = client.post("/v1/chat/completions", json.dumps({"model": "gpt-4o", "messages": messages}),
                           content_type="application/json", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.content[:300]
    assert response["X-ContextLab-Managed"] == "true"
    messages.append({"role": "assistant", "content": json.loads(response.content)["choices"][0]["message"]["content"]})
    return response


def test_it_records_a_call_in_the_same_sql_statements_at_100_and_1000_live_messages(alice: User, alice_token: str):
    profile = services.profile_create(owner=alice, name="wide", knobs={"max_input_length": 10_000_000})
    statements: dict[int, list[str]] = {}
    with Provider(lambda body: Answer(REPLY)) as provider:
        UpstreamProvider.objects.create(profile=profile, base_url=provider.base_url, api_key="sk-up", timeout=30)
        client = Client()
        for size in (100, 1_000):
            messages = _conversation(size)
            _call(client, alice_token, messages)  # ingests the conversation
            _call(client, alice_token, messages)  # this process now keeps its engine and digests
            with CaptureQueriesContext(connection) as queries:
                response = _call(client, alice_token, messages)
            statements[size] = [q["sql"].split(" ", 1)[0] for q in queries.captured_queries]
            row = GatewaySession.objects.get(session_id=response["X-ContextLab-Session"])
            # The row records every message ingested (the system prompt aside), chained, in constant size.
            assert row.history_length == len(messages) - 1
            assert row.history_chain == history.chained([history.digest(m) for m in messages[1:]])[-1]
    assert statements[100] == statements[1_000]
    assert len(statements[1_000]) <= 20, statements[1_000]


def test_it_continues_and_repeats_by_the_chain_as_by_the_list():
    digests = [history.digest({"role": "user", "content": str(i)}) for i in range(6)]
    chains = history.chained(digests)
    for stored_length in range(7):
        stored = digests[:stored_length]
        record = history.Ingested.of(history.chained(stored))
        for incoming_length in range(7):
            for incoming in (digests[:incoming_length], ["x", *digests[1:incoming_length]]):
                incoming_chains = history.chained(incoming)
                assert history.continues_chain(record, incoming_chains) == history.continues(stored, incoming)
                assert history.repeats_chain(record, incoming_chains) == history.repeats(stored, incoming)
    assert history.chained(digests[3:], chains[2]) == chains[3:]


def test_it_chains_the_history_of_an_existing_row_on_migrating(alice: User):
    from django.db.migrations.executor import MigrationExecutor

    before = [("gateway", "0004_merge_issue12b_observe_reply")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    # Only the gateway's tables went back: the session is made as today.
    session = services.session_create(owner=alice, system_prompt="", title="migrated")
    digests = [history.digest({"role": "user", "content": str(i)}) for i in range(5)]
    old.get_model("gateway", "GatewaySession").objects.create(session_id=session.pk, owner_id=alice.pk, key="k",
                                                                kind="derived", history=digests)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    row = GatewaySession.objects.get(session_id=session.pk)
    chains = history.chained(digests)
    assert row.ingested == history.Ingested(5, chains[-1], chains[-2])
    # A request that sends that history and one more message continues the session.
    assert history.continues_chain(row.ingested, history.chained([*digests, "new"]))
