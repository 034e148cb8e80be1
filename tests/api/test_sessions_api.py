from __future__ import annotations

import uuid

from contextlab.sessions.models import AgentProfile, AgentSession


def test_it_creates_a_session_with_the_default_profile(api, alice):
    response = api.post("/api/v1/sessions", {"system_prompt": "You are terse.", "title": "first"})
    assert response.status_code == 201
    data = response.json()
    session = AgentSession.objects.get(pk=data["id"])
    assert session.owner == alice
    assert session.system_prompt == "You are terse."
    assert data["profile"]["name"] == "default"
    assert data["tokens"] == {"used": 0, "threshold": 89_600, "window": 128_000}


def test_it_creates_a_session_with_a_profile_by_name_or_id(api, small_profile):
    by_name = api.post("/api/v1/sessions", {"system_prompt": "", "profile": "small"}).json()
    by_id = api.post("/api/v1/sessions", {"system_prompt": "", "profile": small_profile.pk}).json()
    assert by_name["profile"]["id"] == by_id["profile"]["id"] == small_profile.pk


def test_it_creates_a_session_with_inline_profile_settings(api, alice):
    response = api.post("/api/v1/sessions", {"system_prompt": "", "profile": {
        "name": "tiny", "max_input_length": 8_000, "policy": "copaw"}})
    assert response.status_code == 201
    profile = AgentProfile.objects.get(owner=alice, name="tiny")
    assert profile.policy == "copaw"
    assert response.json()["tokens"]["window"] == 8_000


def test_it_refuses_another_users_profile(api, bob):
    theirs = AgentProfile.objects.create(owner=bob, name="bobs")
    response = api.post("/api/v1/sessions", {"system_prompt": "", "profile": theirs.pk})
    assert response.status_code == 422
    assert response.json()["field"] == "profile"


def test_it_lists_only_the_users_sessions(api, bob_api, alice_session):
    bob_api.post("/api/v1/sessions", {"system_prompt": "bob's"})
    data = api.get("/api/v1/sessions").json()
    assert [s["id"] for s in data["sessions"]] == [str(alice_session.id)]
    assert data["count"] == 1


def test_it_filters_the_list(api, alice_session, small_profile):
    assert api.get("/api/v1/sessions", profile=small_profile.pk).json()["count"] == 1
    assert api.get("/api/v1/sessions", failed="true").json()["count"] == 0
    response = api.get("/api/v1/sessions", limit="0")
    assert response.status_code == 400
    assert response.json()["field"] == "limit"


def test_it_shows_a_session(api, alice_session):
    data = api.get(f"/api/v1/sessions/{alice_session.id}").json()
    assert data["id"] == str(alice_session.id)
    assert data["system_prompt"] == "You are a careful coding agent."
    assert data["latest_turn"] is None
    assert data["pending_tool_calls"] == []


def test_it_hides_alices_session_from_bob(bob_api, alice_session):
    base = f"/api/v1/sessions/{alice_session.id}"
    for path in (base, f"{base}/turns", f"{base}/turns/1", f"{base}/summaries", f"{base}/export"):
        response = bob_api.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]
    for path in (f"{base}/messages", f"{base}/prepare", f"{base}/usage", f"{base}/compact"):
        response = bob_api.post(path, {"messages": [{"role": "user", "content": "hi"}], "turn": 1,
                                       "usage": {"prompt_tokens": 1}})
        assert response.status_code == 404, path
    assert alice_session.messages.count() == 0
    assert alice_session.turns.count() == 0


def test_it_404s_a_session_that_does_not_exist(api):
    response = api.get(f"/api/v1/sessions/{uuid.uuid4()}")
    assert response.status_code == 404
    assert response.json()["field"] == "id"
