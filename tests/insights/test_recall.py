"""Retrieval: the recall page and POST /api/v1/sessions/<id>/recall."""

from __future__ import annotations

from django.urls import reverse

from contextlab.sessions.models import SessionMessage
from tests.insights.conftest import XSS


def _api(session) -> str:
    return f"/api/v1/sessions/{session.id}/recall"


def test_the_api_returns_hits_from_the_archive(api, compacted_session):
    response = api.post(_api(compacted_session), {"query": "t1.log", "limit": 5})
    assert response.status_code == 200
    data = response.json()
    assert data["query"] == "t1.log"
    assert data["injected"] is None
    assert 1 <= len(data["hits"]) <= 5
    top = data["hits"][0]
    assert top["kind"] == "dialog" and top["location"].startswith("dialog/")
    assert "t1.log" in top["snippet"]
    assert top["seq"] is not None  # the message it came from, for the dashboard's message page
    assert SessionMessage.objects.filter(session=compacted_session).count() == compacted_session.messages_count


def test_inject_appends_a_marked_recollection(api, compacted_session):
    before = compacted_session.messages_count
    response = api.post(_api(compacted_session), {"query": "tabs over spaces", "inject": True})
    assert response.status_code == 201
    data = response.json()
    assert data["hits"]
    injected = data["injected"]
    assert injected["text"].startswith("[recollection")
    assert "tabs over spaces" in injected["text"]
    row = SessionMessage.objects.get(session=compacted_session, message_id=injected["message"]["id"])
    assert row.seq == before + 1
    assert row.role == "user" and row.name == "recollection"
    assert row.content[0]["text"].startswith("[recollection")
    assert data["session"]["messages"] == before + 1


def test_the_recollection_reaches_the_next_payload(api, compacted_session):
    api.post(_api(compacted_session), {"query": "t2.log", "inject": True})
    payload = api.post(f"/api/v1/sessions/{compacted_session.id}/prepare").json()["messages"]
    assert payload[-1]["role"] == "user"
    assert payload[-1]["content"].startswith("[recollection")


def test_bad_bodies_name_the_field(api, compacted_session):
    for body, field in (({}, "query"), ({"query": "  "}, "query"), ({"query": 3}, "query"),
                        ({"query": "x" * 1001}, "query"), ({"query": "t1", "limit": 0}, "limit"),
                        ({"query": "t1", "limit": True}, "limit"), ({"query": "t1", "limit": "5"}, "limit"),
                        ({"query": "t1", "inject": "yes"}, "inject")):
        response = api.post(_api(compacted_session), body)
        assert response.status_code == 400, body
        assert response.json()["field"] == field, body
    assert api.post(_api(compacted_session), raw="not json").json()["field"] == "body"


def test_the_api_needs_a_token_and_the_owner(client, bob_api, compacted_session):
    assert client.post(_api(compacted_session), "{}", content_type="application/json").status_code == 401
    response = bob_api.post(_api(compacted_session), {"query": "t1.log", "inject": True})
    assert response.status_code == 404
    assert not SessionMessage.objects.filter(session=compacted_session, name="recollection").exists()


def test_the_api_is_post_only(api, compacted_session):
    assert api.get(_api(compacted_session)).status_code == 405


def test_the_page_lists_hits_with_their_locations(alice_client, compacted_session):
    url = reverse("cl-insights-recall", args=[compacted_session.id])
    html = alice_client.get(url, {"q": "t1.log"}).content.decode()
    assert "hit" in html and "dialog/" in html
    assert reverse("cl-session-file", args=[compacted_session.id, "x"]).rsplit("/", 1)[0] in html
    assert "?line=" in html
    assert "/messages/" in html  # link to the message the hit belongs to


def test_the_page_escapes_queries_and_snippets(alice_client, alice_session):
    (alice_session.workspace / "memory").mkdir(parents=True, exist_ok=True)
    (alice_session.workspace / "memory" / "2026-03-01.md").write_text(
        f"# 2026-03-01\n\n## Preferences\n- [09:00] I prefer {XSS} everywhere\n", encoding="utf-8")
    url = reverse("cl-insights-recall", args=[alice_session.id])
    html = alice_client.get(url, {"q": f"prefer {XSS}"}).content.decode()
    assert XSS not in html
    assert "memory/2026-03-01.md:4" in html
    assert "&lt;script&gt;" in html


def test_another_user_gets_a_404(bob_client, compacted_session):
    url = reverse("cl-insights-recall", args=[compacted_session.id])
    assert bob_client.get(url, {"q": "t1"}).status_code == 404
