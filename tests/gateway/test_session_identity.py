"""Which session a call belongs to: the session header, or a key derived from the first messages."""

from __future__ import annotations

import httpx2
import pytest
from openai import BadRequestError, OpenAI

from contextlab.gateway.models import GatewayExchange, GatewaySession, UpstreamProvider
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession
from tests.gateway.provider import Answer

SYSTEM = {"role": "system", "content": "You are a build agent."}


def _talk(client: OpenAI, messages: list, rounds: int, **kwargs) -> list:
    for n in range(rounds):
        reply = client.chat.completions.create(model="gpt-4o", messages=messages, **kwargs).choices[0].message
        messages = [*messages, reply, {"role": "user", "content": f"next {n}"}]
    return messages


def test_it_tells_conversations_apart_by_their_first_messages(openai_client, provider):
    _talk(openai_client, [SYSTEM, {"role": "user", "content": "Fix the build"}], 3)
    _talk(openai_client, [SYSTEM, {"role": "user", "content": "Write the release notes"}], 2)
    sessions = {s.title: s.turns_count for s in AgentSession.objects.all()}
    assert sessions == {"gateway · Fix the build": 3, "gateway · Write the release notes": 2}
    assert set(GatewaySession.objects.values_list("kind", flat=True)) == {"derived"}


def test_it_uses_the_session_header_as_a_key(gateway_url, alice_token, upstream, provider):
    first = [SYSTEM, {"role": "user", "content": "Fix the build"}]
    for run in ("run-1", "run-2"):
        client = OpenAI(base_url=gateway_url, api_key=alice_token, max_retries=0,
                        default_headers={"X-ContextLab-Session": run})
        _talk(client, first, 2)
    assert sorted(AgentSession.objects.values_list("title", "turns_count")) == \
        [("gateway · run-1", 2), ("gateway · run-2", 2)]
    assert set(GatewaySession.objects.values_list("key", flat=True)) == {"run-1", "run-2"}


def test_it_drives_a_named_session(gateway_url, alice, alice_token, small_profile, upstream, provider):
    session = services.session_create(owner=alice, system_prompt="", profile=small_profile, title="made by the API")
    client = OpenAI(base_url=gateway_url, api_key=alice_token, max_retries=0,
                    default_headers={"X-ContextLab-Session": str(session.pk)})
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=[SYSTEM, {
        "role": "user", "content": "hello"}])
    assert raw.headers["X-ContextLab-Session"] == str(session.pk)
    session.refresh_from_db()
    assert (AgentSession.objects.count(), session.turns_count, session.system_prompt) == (1, 1, SYSTEM["content"])


def test_it_starts_a_new_session_when_the_client_rewrites_its_history(openai_client, provider):
    messages = _talk(openai_client, [SYSTEM, {"role": "user", "content": "Fix the build"}], 2)
    original = AgentSession.objects.get()
    edited = [*messages[:2], {"role": "assistant", "content": "I edited this answer."}, *messages[3:]]
    openai_client.chat.completions.create(model="gpt-4o", messages=edited)
    fork = AgentSession.objects.exclude(pk=original.pk).get()
    assert GatewaySession.objects.get(session=fork).forked_from == original
    assert GatewayExchange.objects.order_by("-created").first().identity == "forked"
    # The fork holds the client's history as sent; the original is left as it was.
    assert fork.messages.count() == len(edited) - 1 + 1  # the system prompt is not a message; plus the reply
    assert original.turns_count == 2
    # And the original conversation can still go on where it was.
    openai_client.chat.completions.create(model="gpt-4o", messages=messages)
    original.refresh_from_db()
    assert original.turns_count == 3 and AgentSession.objects.count() == 2


def test_it_keeps_parallel_runs_of_one_task_apart(openai_client, provider):
    provider.responder = lambda body: Answer(f"reply to {len(body['messages'])} messages #{len(provider.requests)}")
    start = [SYSTEM, {"role": "user", "content": "Run the nightly checks"}]
    a, b = list(start), list(start)
    for n in range(3):  # interleaved: a, b, a, b, ...
        for history in (a, b):
            reply = openai_client.chat.completions.create(model="gpt-4o", messages=history).choices[0].message
            history += [reply, {"role": "user", "content": f"step {n}"}]
    assert AgentSession.objects.count() == 2
    assert sorted(AgentSession.objects.values_list("turns_count", flat=True)) == [3, 3]


def test_it_follows_a_system_prompt_that_changes_every_call(openai_client, provider, upstream):
    upstream.identity = UpstreamProvider.Identity.FIRST_USER
    upstream.save()
    messages: list = [{"role": "user", "content": "Keep an eye on the queue"}]
    for minute in range(3):
        system = {"role": "system", "content": f"You are a monitor. The time is 10:0{minute}."}
        reply = openai_client.chat.completions.create(model="gpt-4o", messages=[system, *messages])
        messages += [reply.choices[0].message, {"role": "user", "content": "and now?"}]
        assert provider.chat_requests[-1].body["messages"][0] == system
    session = AgentSession.objects.get()
    assert session.turns_count == 3
    assert session.system_prompt == "You are a monitor. The time is 10:02."


def test_it_asks_which_profile_when_several_are_routed(openai_client, alice, gateway_url, alice_token, provider):
    other = services.profile_create(owner=alice, name="big", knobs={})
    UpstreamProvider.objects.create(profile=other, base_url=provider.base_url)
    with pytest.raises(BadRequestError) as caught:
        openai_client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["code"] == "contextlab_ambiguous_profile"
    assert "X-ContextLab-Profile" in caught.value.message
    named = OpenAI(base_url=gateway_url, api_key=alice_token, max_retries=0,
                   default_headers={"X-ContextLab-Profile": "big"})
    named.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert AgentSession.objects.get().profile == other


def test_the_same_request_as_a_new_call_is_a_second_run_not_a_retry(openai_client, provider):
    """Without the SDK's retry count, the same first request again is another run of the task: a fork."""
    messages = [SYSTEM, {"role": "user", "content": "Fix the build"}]
    openai_client.chat.completions.create(model="gpt-4o", messages=messages)
    openai_client.chat.completions.create(model="gpt-4o", messages=messages)
    original, fork = AgentSession.objects.order_by("created")
    assert GatewaySession.objects.get(session=fork).forked_from == original
    assert (original.turns_count, fork.turns_count) == (1, 1)


def test_an_sdk_retry_of_a_call_whose_reply_it_recorded_replaces_that_reply(openai_client, provider, gateway_url,
                                                                             alice_token):
    """The SDK counts its retries (X-Stainless-Retry-Count): a retry is the same call, not a new run."""
    messages = [SYSTEM, {"role": "user", "content": "Fix the build"}]
    openai_client.chat.completions.create(model="gpt-4o", messages=messages)
    # What the SDK sends when it retries after losing the first answer (the header is its own).
    with httpx2.Client(timeout=30) as http:
        retried = http.post(f"{gateway_url}/chat/completions", json={"model": "gpt-4o", "messages": messages},
                            headers={"Authorization": f"Bearer {alice_token}", "X-Stainless-Retry-Count": "1"})
    assert retried.status_code == 200
    session = AgentSession.objects.get()
    assert session.turns_count == 1
    assert list(session.messages.order_by("seq").values_list("role", flat=True)) == ["user", "assistant"]
