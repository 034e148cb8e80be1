"""Item 4 of the trust boundary: a lone surrogate ("\\ud800") never breaks a session.

JSON can spell one, Python decodes it, but no UTF-8 encoder takes it: stored, it
made every page, list and the export of the session answer 500. The API refuses
it naming the field; the gateway and imports, which carry what an agent or a
recording holds, repair it to U+FFFD; rows stored before are repaired on read.
"""

from __future__ import annotations

import io
import json
import zipfile

import httpx2
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.urls import reverse

from contextlab.engine.core.errors import ContextLabError
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, SessionMessage
from tests.conversations import tool_turn

BAD = "build\ud800"


def _tool_turn_named(name: str) -> list[dict]:
    call, result = tool_turn(1, output_bytes=200)[-2:]
    call = json.loads(json.dumps(call))
    call["tool_calls"][0]["function"]["name"] = name
    return [{"role": "user", "content": "go"}, call, {**result, "name": name}]


def _session_pages(client, session: AgentSession) -> list[str]:
    first = session.messages.order_by("seq").first()
    assert first is not None
    return [reverse("cl-session-detail", args=[session.pk]), reverse("cl-session-messages", args=[session.pk]),
            reverse("cl-message-detail", args=[session.pk, first.seq]),
            reverse("cl-insights-operations", args=[session.pk]), reverse("cl-session-export", args=[session.pk])]


def _assert_readable(client, session: AgentSession) -> None:
    for url in _session_pages(client, session):
        response = client.get(url)
        assert response.status_code == 200, url
        body = response.content if not response.streaming else b"".join(response.streaming_content)
        body.decode("utf-8") if not url.endswith("/export/") else zipfile.ZipFile(io.BytesIO(body)).testzip()


# -- the API refuses, naming the field ------------------------------------------------------


@pytest.mark.parametrize(("path", "body", "field"), [
    ("sessions", {"system_prompt": BAD}, "system_prompt"),
    ("sessions", {"title": BAD}, "title"),
    ("sessions", {"profile": BAD}, "profile"),
    ("sessions", {"profile": {"name": BAD}}, "profile.name"),
    ("sessions", {"profile": {"compaction_model": BAD}}, "profile.compaction_model"),
    ("sessions", {"profile": {"timezone": BAD}}, "profile.timezone"),
    ("profiles", {"name": BAD}, "name"),
    ("profiles", {"name": "p", "compaction_model": BAD}, "compaction_model"),
    ("profiles", {"name": "p", "timezone": BAD}, "timezone"),
    ("{session}/messages", {"messages": _tool_turn_named(BAD)}, "messages[1].tool_calls[0].function.name"),
    ("{session}/messages", {"messages": [{"role": "user", "content": "hi", "name": BAD}]}, "messages[0].name"),
    ("{session}/messages", {"messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
    ("{session}/compact", {"instruction": BAD}, "instruction"),
    ("{session}/recall", {"query": BAD, "inject": True}, "query"),
])
def test_it_refuses_a_lone_surrogate_naming_the_field(api, alice_client, alice_session, path, body, field):
    services.messages_append(session=alice_session, messages=[{"role": "user", "content": "hello"}])
    url = "/api/v1/" + path.format(session=f"sessions/{alice_session.pk}")
    response = api.post(url, body)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    _assert_readable(alice_client, alice_session)


@pytest.mark.parametrize("field", ["system_prompt", "title"])
def test_the_services_refuse_it_too(alice, field):
    with pytest.raises(ContextLabError) as info:
        services.session_create(owner=alice, **{"system_prompt": "", field: BAD})
    assert info.value.field == field


def test_the_services_refuse_it_in_messages(alice_session):
    with pytest.raises(ContextLabError) as info:
        services.messages_append(session=alice_session, messages=_tool_turn_named(BAD))
    assert info.value.field == "messages[1].tool_calls[0].function.name"


# -- imports and the gateway repair ---------------------------------------------------------


def test_an_imported_transcript_is_repaired(api, alice_client):
    transcript = json.dumps(_tool_turn_named(BAD)).encode()
    assert b"\\ud800" in transcript
    response = api.client.post("/api/v1/imports", {"file": SimpleUploadedFile("t.json", transcript)},
                               headers=api.headers)
    assert response.status_code == 201, response.content
    session = AgentSession.objects.get(pk=response.json()["id"])
    names = [b.get("name") for row in session.messages.all() for b in row.content if isinstance(b, dict)]
    assert "build\ufffd" in names
    _assert_readable(alice_client, session)


def test_the_gateway_repairs_what_an_agent_sends(gateway_url, alice_token, upstream, provider, alice):
    body = {"model": "gpt-4o", "messages": [{"role": "system", "content": "sys"}, *_tool_turn_named(BAD)]}
    raw = json.dumps(body).encode()
    assert b"\\ud800" in raw
    with httpx2.Client(timeout=30) as http:
        response = http.post(f"{gateway_url}/chat/completions", content=raw,
                             headers={"Authorization": f"Bearer {alice_token}", "Content-Type": "application/json"})
    assert response.status_code == 200, response.content
    session = AgentSession.objects.get()
    stored = json.dumps([row.content for row in session.messages.all()], ensure_ascii=False)
    assert "build\ufffd" in stored and "\ud800" not in stored
    from django.test import Client
    client = Client()
    client.force_login(alice)
    _assert_readable(client, session)


# -- rows stored before the boundaries refused it ------------------------------------------


def test_rows_stored_before_are_repaired_on_read(alice_client, alice_session):
    if connection.vendor == "postgresql":
        pytest.skip("PostgreSQL's jsonb refuses a lone surrogate: no such row can exist there")
    services.messages_append(session=alice_session, messages=tool_turn(1, output_bytes=300))
    services.session_prepare(session=alice_session)
    row = SessionMessage.objects.filter(session=alice_session).order_by("seq").last()
    assert row is not None
    # Written as the JSON column stores it: the surrogate as an ASCII escape.
    SessionMessage.objects.filter(pk=row.pk).update(content=[*row.content, {"type": "text", "text": BAD}],
                                                    fate=[*row.fate, {"event": "note", "text": BAD}])
    AgentSession.objects.filter(pk=alice_session.pk).update(
        engine_state={**alice_session.engine_state, "note": BAD})
    assert "\ufffd" in json.dumps(SessionMessage.objects.get(pk=row.pk).content, ensure_ascii=False)
    _assert_readable(alice_client, alice_session)
    bundle = alice_client.get(reverse("cl-session-export", args=[alice_session.pk])).content
    with zipfile.ZipFile(io.BytesIO(bundle)) as archive:
        assert "build\ufffd" in archive.read("messages.jsonl").decode("utf-8")


# -- forms: the browser's bytes are decoded with replacement, never into a surrogate --------


@pytest.mark.parametrize("name", ["cl-session-search", "cl-insights-recall"])
def test_forms_take_the_bytes_of_a_surrogate_as_replacement_text(alice_client, alice_session, name):
    services.messages_append(session=alice_session, messages=[{"role": "user", "content": "hello"}])
    # UTF-8 bytes of U+D800, which no UTF-8 decoder accepts.
    response = alice_client.get(reverse(name, args=[alice_session.pk]) + "?q=build%ED%A0%80")
    assert response.status_code == 200
    response.content.decode("utf-8")

