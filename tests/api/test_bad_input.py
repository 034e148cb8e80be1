"""Spec §3: every bad input gets a 4xx JSON answer naming the field, and nothing is half-written."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from contextlab.sessions.models import AgentProfile, AgentSession, SessionMessage

USER = {"role": "user", "content": "hello"}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "a.py"}


def _nested(depth: int) -> str:
    return '{"messages": [{"role": "user", "content": "x", "metadata": ' + "[" * depth + "]" * depth + "}]}"


BAD_MESSAGES = [
    ("malformed json", "{not json", 400, "body"),
    ("truncated json", '{"messages": [', 400, "body"),
    ("not an object", "[1, 2]", 400, "body"),
    ("nan", '{"messages": [], "x": NaN}', 400, "body"),
    ("deeply nested", _nested(5_000), 400, "body"),
    ("moderately deep", _nested(150), 400, "body"),
    ("missing messages", "{}", 400, "messages"),
    ("messages not a list", '{"messages": {"role": "user"}}', 400, "messages"),
    ("empty list", '{"messages": []}', 400, "messages"),
    ("unknown role", json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}), 400, "messages[0].role"),
    ("orphan tool result", json.dumps({"messages": [USER, RESULT]}), 400, "messages[1].tool_call_id"),
    ("tool call without result", json.dumps({"messages": [USER, CALL, USER]}), 400, "messages[2]"),
    ("duplicate ids", json.dumps({"messages": [
        {"id": "m1", "name": "u", "role": "user", "content": [{"type": "text", "text": "a"}], "metadata": {},
         "timestamp": "2026-01-01 00:00:00.000"},
        {"id": "m1", "name": "u", "role": "user", "content": [{"type": "text", "text": "b"}], "metadata": {},
         "timestamp": "2026-01-01 00:00:01.000"}]}), 400, "messages[1].id"),
    ("lone surrogate", '{"messages": [{"role": "user", "content": "bad \\ud800 text"}]}', 400, "messages[0].content"),
    ("nul character", '{"messages": [{"role": "user", "content": "a\\u0000b"}]}', 400, "messages[0]"),
]


@pytest.mark.parametrize(("label", "body", "status", "field"), BAD_MESSAGES, ids=[b[0] for b in BAD_MESSAGES])
def test_it_refuses_bad_messages_naming_the_field(api, alice_session, label, body, status, field):
    response = api.post(f"/api/v1/sessions/{alice_session.id}/messages", raw=body)
    assert response.status_code == status, response.content
    data = response.json()
    assert data["field"] == field, data
    assert data["error"]
    assert not SessionMessage.objects.filter(session=alice_session).exists()


def test_it_refuses_a_body_that_is_not_utf8(api, alice_session):
    response = api.post(f"/api/v1/sessions/{alice_session.id}/messages",
                        raw=b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}')
    assert response.status_code == 400
    assert response.json()["field"] == "body"


def test_it_refuses_a_body_over_the_size_limit(api, alice_session, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    huge = json.dumps({"messages": [{"role": "user", "content": "x" * 20_000}]})
    response = api.post(f"/api/v1/sessions/{alice_session.id}/messages", raw=huge)
    assert response.status_code == 413
    assert response.json()["field"] == "body"


def test_it_refuses_a_message_over_the_profiles_byte_limit(api, alice):
    session = api.post("/api/v1/sessions", {"system_prompt": "", "profile": {
        "name": "tight", "max_message_bytes": 1_000}}).json()
    body = {"messages": [USER, CALL, {**RESULT, "content": "y" * 5_000}]}
    response = api.post(f"/api/v1/sessions/{session['id']}/messages", body)
    assert response.status_code == 400
    assert response.json()["field"] == "messages[2].content"
    assert SessionMessage.objects.count() == 0


def test_it_keeps_a_session_intact_after_a_bad_batch(api, alice_session):
    base = f"/api/v1/sessions/{alice_session.id}/messages"
    assert api.post(base, {"messages": [USER, CALL]}).status_code == 201
    bad = api.post(base, {"messages": [USER]})  # the pending call has no result yet
    assert bad.status_code == 400
    assert api.post(base, {"messages": [RESULT]}).status_code == 201
    assert SessionMessage.objects.filter(session=alice_session).count() == 3


BAD_SESSIONS = [
    ("missing system prompt", {}, 400, "system_prompt"),
    ("system prompt not text", {"system_prompt": 5}, 400, "system_prompt"),
    ("title not text", {"system_prompt": "", "title": ["x"]}, 400, "title"),
    ("reserve at the threshold", {"system_prompt": "", "profile": {"compact_ratio": 0.3, "reserve_ratio": 0.3}},
     422, "profile.reserve_ratio"),
    ("window out of bounds", {"system_prompt": "", "profile": {"max_input_length": 10}}, 422,
     "profile.max_input_length"),
    ("unknown knob", {"system_prompt": "", "profile": {"colour": "blue"}}, 422, "profile.colour"),
    ("knob of the wrong type", {"system_prompt": "", "profile": {"recent_n": "three"}}, 422, "profile.recent_n"),
    ("unknown profile", {"system_prompt": "", "profile": "nope"}, 422, "profile"),
    ("profile of a bad type", {"system_prompt": "", "profile": [1]}, 422, "profile"),
]


@pytest.mark.parametrize(("label", "body", "status", "field"), BAD_SESSIONS, ids=[b[0] for b in BAD_SESSIONS])
def test_it_refuses_bad_sessions_naming_the_field(api, alice, label, body, status, field):
    response = api.post("/api/v1/sessions", body)
    assert response.status_code == status, response.content
    assert response.json()["field"] == field
    assert not AgentSession.objects.exists()
    assert not AgentProfile.objects.filter(owner=alice).exclude(name="default").exists()


def test_it_refuses_a_profile_with_reserve_at_the_threshold(api):
    response = api.post("/api/v1/profiles", {"name": "bad", "compact_ratio": 0.2, "reserve_ratio": 0.25})
    assert response.status_code == 422
    assert response.json()["field"] == "reserve_ratio"
    assert "threshold" in response.json()["error"]


@pytest.mark.parametrize(("body", "field"), [
    ({"usage": {"prompt_tokens": 1}}, "turn"),
    ({"turn": "one", "usage": {"prompt_tokens": 1}}, "turn"),
    ({"turn": 1}, "usage"),
    ({"turn": 1, "usage": {"prompt_tokens": "many"}}, "usage.prompt_tokens"),
    ({"turn": 1, "usage": {"prompt_tokens": -4}}, "usage.prompt_tokens"),
])
def test_it_refuses_bad_usage_reports(api, alice_session, body, field):
    api.post(f"/api/v1/sessions/{alice_session.id}/messages", {"messages": [USER]})
    api.post(f"/api/v1/sessions/{alice_session.id}/prepare")
    response = api.post(f"/api/v1/sessions/{alice_session.id}/usage", body)
    assert response.status_code == 400
    assert response.json()["field"] == field


@pytest.mark.parametrize(("body", "field"), [
    # Found by the fuzzer on PostgreSQL: the schemas are saved with the engine's
    # state, and no PostgreSQL text or JSON holds NUL (a 500 at save).
    ({"response_format": {"type": "json_schema", "a\x00b": {}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x\x00"}}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "run", "description": "a\x00b"}}]}, "tools[0]"),
])
def test_it_refuses_a_nul_in_the_schemas_of_a_prepare(api, alice_session, body, field):
    api.post(f"/api/v1/sessions/{alice_session.id}/messages", {"messages": [USER]})
    response = api.post(f"/api/v1/sessions/{alice_session.id}/prepare", body)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    # Nothing of the refused request reached the session: the next prepare works.
    assert api.post(f"/api/v1/sessions/{alice_session.id}/prepare").status_code == 200


@pytest.mark.parametrize(("body", "field"), [
    ({"preview": "yes"}, "preview"),
    ({"instruction": 42}, "instruction"),
])
def test_it_refuses_bad_compaction_requests(api, alice_session, body, field):
    response = api.post(f"/api/v1/sessions/{alice_session.id}/compact", body)
    assert response.status_code == 400
    assert response.json()["field"] == field


@pytest.mark.parametrize(("name", "content", "field"), [
    ("notes.json", b'{"hello": "world"}', "file"),
    ("broken.json", b'[{"role": "user", "content": ', "file"),
    ("latin1.json", b'[{"role": "user", "content": "caf\xe9"}]', "file"),
    ("deep.json", b"[" * 5_000 + b"]" * 5_000, "file"),
    ("fake.zip", b"PK\x03\x04 this is not a zip", "file"),
])
def test_it_refuses_bad_imports(api, name, content, field):
    upload = SimpleUploadedFile(name, content)
    response = api.client.post("/api/v1/imports", {"file": upload}, headers=api.headers)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert not AgentSession.objects.exists()


def test_it_asks_for_the_file_of_an_import(api):
    response = api.client.post("/api/v1/imports", {"title": "x"}, headers=api.headers)
    assert response.status_code == 400
    assert response.json()["field"] == "file"
