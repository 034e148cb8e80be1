"""Observe mode with an ordinary client: unchanged bytes, usage beside the count, failures left out."""

from __future__ import annotations

import json

import httpx2
import pytest
from django.test import Client

from contextlab.gateway import observe as observe_gateway
from contextlab.gateway.models import ObservedCall, UpstreamProvider
from contextlab.sessions.models import AgentProfile, AgentSession, SessionMessage, Turn
from contextlab.sessions.services.observed import observed_session_write
from tests.gateway.observed_calls import session_of
from tests.gateway.provider import USAGE, Answer, Error, Provider, completion, scripted


@pytest.fixture
def observed(small_profile: AgentProfile, provider: Provider) -> UpstreamProvider:
    return UpstreamProvider.objects.create(profile=small_profile, base_url=provider.base_url, api_key="sk-up",
                                           model_map={"gpt-4o": "fake-model-2026"},
                                           mode=UpstreamProvider.Mode.OBSERVE, timeout=30)


def _post(url: str, token: str, body: dict, **headers: str) -> httpx2.Response:
    data = json.dumps(body, indent=2).encode()
    with httpx2.Client(timeout=30) as http:
        return http.post(f"{url}/chat/completions", content=data,
                         headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", **headers})


def test_it_passes_a_completion_unchanged_and_keeps_the_providers_usage(gateway_url, alice_token, observed,
                                                                        provider) -> None:
    provider.responder = scripted(Answer("Hello there."))
    body = {"model": "gpt-4o", "messages": [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "Say hello to the observer, please."}]}
    answer = _post(gateway_url, alice_token, body)
    assert answer.status_code == 200
    # No model mapping, no re-serialisation: the provider gets the client's bytes.
    assert provider.chat_requests[-1].raw == json.dumps(body, indent=2).encode()
    assert answer.content == json.dumps(completion(Answer("Hello there."), 1)).encode()
    assert answer.headers["X-ContextLab-Managed"] == "false"
    session = AgentSession.objects.get(pk=session_of(answer))
    turn = Turn.objects.get(session=session)
    assert turn.usage == USAGE and turn.policy == "observed"
    assert turn.payload_tokens > 0 and turn.payload == body["messages"]
    browser = Client()
    browser.force_login(session.owner)
    page = browser.get(turn.get_absolute_url()).content.decode()
    assert f'<span data-k="usage-prompt">{USAGE["prompt_tokens"]}</span> prompt' in page
    assert f"counted here: {turn.payload_tokens}" in page and "request 1, as the agent sent it" in page


def test_it_records_an_upstream_failure_but_leaves_it_out_of_the_session(gateway_url, alice_token, observed,
                                                                          provider) -> None:
    provider.responder = scripted(Error(500))
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "This call will fail upstream."}]}
    answer = _post(gateway_url, alice_token, body)
    assert answer.status_code == 500 and answer.content == Error(500).body
    call = ObservedCall.objects.get()
    assert call.status_code == 500 and call.session is None
    assert not AgentSession.objects.filter(source__format="observed").exists()


def test_it_keeps_conversations_named_by_the_session_header_apart(gateway_url, alice_token, observed,
                                                                  provider) -> None:
    provider.responder = scripted(Answer("ok"))
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "The same opening words for two runs."}]}
    first = _post(gateway_url, alice_token, body, **{"X-ContextLab-Session": "run-1"})
    second = _post(gateway_url, alice_token, body, **{"X-ContextLab-Session": "run-2"})
    assert session_of(first) != session_of(second)
    assert AgentSession.objects.filter(source__format="observed").count() == 2


def test_it_reads_again_the_calls_another_process_recorded(gateway_url, alice, alice_token, observed,
                                                          provider) -> None:
    # The inference is kept in the process between calls and fed only the new one;
    # a call another web process recorded meanwhile must not be skipped.
    provider.responder = lambda body: Answer(f"Reply {len(body['messages'])}.")
    messages: list[dict] = [{"role": "system", "content": "Be brief."}]

    def step(text: str, *, elsewhere: bool = False) -> None:
        messages.append({"role": "user", "content": text})
        body = {"model": "gpt-4o", "messages": list(messages)}
        if elsewhere:
            reply = f"Reply {len(messages)}."
            ObservedCall.objects.create(owner=alice, profile=observed.profile, body=body, reply_text=reply,
                                        status_code=200)
        else:
            answer = _post(gateway_url, alice_token, body)
            assert answer.status_code == 200
            reply = answer.json()["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": reply})

    step("one")
    step("two")
    step("three", elsewhere=True)
    step("four")
    session = AgentSession.objects.get(source__format="observed")
    turns = list(session.turns.order_by("number"))
    assert [t.payload[-1]["content"] for t in turns] == ["one", "two", "three", "four"]
    assert session.messages_count == 8  # the four asks, three replies sent back, and the last reply
    # The call recorded elsewhere, never rebuilt there, is a pending record the next call took in.
    assert set(ObservedCall.objects.values_list("session", flat=True)) == {session.pk}
    assert not ObservedCall.objects.filter(conversation="").exists()


def test_it_writes_every_row_again_when_another_writer_rewrote_the_session(gateway_url, alice_token, observed,
                                                                          provider) -> None:
    # The process remembers the rows its last rewrite left and writes only the changed
    # ones; rows another writer wrote again since (new ids, same count) must not be
    # taken for them.
    provider.responder = lambda body: Answer(f"Reply {len(body['messages'])}.")
    messages: list[dict] = [{"role": "system", "content": "Be brief."}]

    def call(text: str) -> None:
        messages.append({"role": "user", "content": text})
        answer = _post(gateway_url, alice_token, {"model": "gpt-4o", "messages": list(messages)})
        assert answer.status_code == 200
        messages.append({"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]})

    def rows(session: AgentSession) -> list[tuple]:
        return list(SessionMessage.objects.filter(session=session).order_by("seq").values_list(
            "message_id", "seq", "status", "content", "fate"))

    call("one")
    call("two")
    session = AgentSession.objects.get(source__format="observed")
    recorded = [observe_gateway._recorded_request(seq, c) for seq, c in
                enumerate(ObservedCall.objects.filter(status_code=200).order_by("pk"), start=1)]
    conversation = ObservedCall.objects.order_by("pk").first().conversation
    observed_session_write(session, recorded, conversation)  # another writer: every row, new ids
    # The agent's own context manager drops the first exchange: rows written before change.
    del messages[1:3]
    call("three")
    written = rows(session)
    recorded = [observe_gateway._recorded_request(seq, c) for seq, c in
                enumerate(ObservedCall.objects.filter(status_code=200).order_by("pk"), start=1)]
    observed_session_write(session, recorded, conversation)
    assert written == rows(session)
    assert len(written) == 6 and sum(1 for row in written if row[2] != "live") == 2


def test_it_writes_after_each_call_the_rows_a_rewrite_from_every_request_writes(gateway_url, alice_token, observed,
                                                                               provider) -> None:
    # Each call walks only its own request, continuing from the rows the previous call
    # derived; what it leaves must be what deriving them from every request leaves,
    # through a tool output the agent shortens, an exchange it drops, and messages
    # it sends again after leaving them out once.
    provider.responder = lambda body: Answer(f"Reply {len(body['messages'])}.")
    output = "line of build output\n" * 200
    call_message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": '{"cmd": "make"}'}}]}
    steps: list[list[dict]] = []
    base: list[dict] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Build it."},
                        call_message, {"role": "tool", "tool_call_id": "call_1", "content": output}]
    steps.append(base)
    steps.append([*base, {"role": "assistant", "content": "Reply 4."}, {"role": "user", "content": "Again."}])
    shortened = {"role": "tool", "tool_call_id": "call_1",
                 "content": output[:200] + "\n[output shortened: full text in /tmp/out-1.txt]"}
    steps.append([*base[:3], shortened, {"role": "assistant", "content": "Reply 4."},
                  {"role": "user", "content": "Again."}, {"role": "assistant", "content": "Reply 6."},
                  {"role": "user", "content": "Note A."}])
    # A system prompt changed for one request and back: the first one is live again.
    steps.append([{"role": "system", "content": "Be brief, now."}, {"role": "user", "content": "Again."},
                  {"role": "assistant", "content": "Reply 6."}, {"role": "user", "content": "Third."}])
    steps.append([base[0], {"role": "user", "content": "Again."}, {"role": "assistant", "content": "Reply 6."},
                  {"role": "user", "content": "Note A."}, {"role": "user", "content": "Third."},
                  {"role": "assistant", "content": "Reply 4."}, {"role": "user", "content": "Fourth."}])

    def rows(session: AgentSession) -> list[tuple]:
        return list(SessionMessage.objects.filter(session=session).order_by("seq").values_list(
            "message_id", "seq", "role", "status", "content", "current_content", "truncated_stage",
            "truncated_turn", "compacted_turn", "summary_version", "fate"))

    def turns(session: AgentSession) -> list[tuple]:
        return list(Turn.objects.filter(session=session).order_by("number").values_list(
            "number", "trigger", "outcome", "payload", "used_tokens", "compacted_count", "trace"))

    def state(session: AgentSession) -> tuple:
        session.refresh_from_db()
        return (rows(session), turns(session), session.messages_count, session.live_count, session.turns_count,
                session.tokens_used, sorted(session.offloaded_files.values_list("path", "stage", "bytes")),
                sorted(session.summary_versions.values_list("version", "text", "compacted_ids")))

    for messages in steps:
        answer = _post(gateway_url, alice_token, {"model": "gpt-4o", "messages": messages},
                       **{"X-ContextLab-Session": "one-run"})
        assert answer.status_code == 200
        session = AgentSession.objects.get(pk=session_of(answer))
        recorded = [observe_gateway._recorded_request(seq, c) for seq, c in
                    enumerate(ObservedCall.objects.filter(status_code=200).order_by("pk"), start=1)]
        # Rewritten beside it, in a session of its own: rewriting this one would make
        # the next call write every row again, and test nothing.
        beside = AgentSession.objects.create(owner=session.owner, profile=session.profile, title="beside",
                                             tokens_window=session.tokens_window,
                                             tokens_threshold=session.tokens_threshold)
        observed_session_write(beside, recorded, ObservedCall.objects.order_by("pk").last().conversation)
        written = state(session)
        assert written == state(beside)
        beside.delete()
    assert len(written[1]) == len(steps) and written[2] > written[3] > 0
    [tool] = [row for row in written[0] if row[0] == "tool:call_1"]
    assert "output shortened" in json.dumps(tool[5]) and "output shortened" not in json.dumps(tool[4])
    [system] = [row for row in written[0] if row[2] == "system" and "Be brief." in json.dumps(row[4])]
    assert system[3] == "live"
