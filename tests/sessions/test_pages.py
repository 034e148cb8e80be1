from __future__ import annotations

import pytest
from django.test import Client

from contextlab.sessions import services
from tests.conversations import answer, tool_turn


@pytest.fixture
def alice_client(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def bob_client(bob) -> Client:
    client = Client()
    client.force_login(bob)
    return client


@pytest.fixture
def worked_session(alice_session):
    for i in range(1, 13):
        services.messages_append(session=alice_session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                 *tool_turn(i, output_bytes=1_500)])
        services.session_prepare(session=alice_session)
    alice_session.refresh_from_db()
    return alice_session


def test_it_requires_login(client, alice_session):
    for url in ("/", alice_session.get_absolute_url()):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")


def test_it_shows_the_login_page(client, db):
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert b'name="username"' in response.content


def test_it_lists_the_users_sessions_with_their_numbers(alice_client, worked_session):
    response = alice_client.get("/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "Fix the nightly build" in page
    assert "small" in page  # the profile
    assert f"{worked_session.tokens_used:,}" in page
    assert "4,000" in page and "2,800" in page


def test_it_filters_by_profile_and_failures(alice, alice_client, worked_session):
    other = services.profile_create(owner=alice, name="other", knobs={})
    services.session_create(owner=alice, system_prompt="", profile=other, title="Quiet session")
    page = alice_client.get("/", {"profile": other.pk}).content.decode()
    assert "Quiet session" in page and "Fix the nightly build" not in page
    page = alice_client.get("/", {"failed": "1"}).content.decode()
    assert "Quiet session" not in page and "Fix the nightly build" not in page
    worked_session.failures_count = 1
    worked_session.save()
    page = alice_client.get("/", {"failed": "1"}).content.decode()
    assert "Fix the nightly build" in page


def test_it_renders_only_the_table_for_htmx(alice_client, worked_session):
    response = alice_client.get("/", headers={"HX-Request": "true"})
    page = response.content.decode()
    assert page.lstrip().startswith('<div id="session-table">')
    assert "<html" not in page


def test_it_hides_alices_sessions_from_bob(bob_client, worked_session):
    assert "Fix the nightly build" not in bob_client.get("/").content.decode()
    assert bob_client.get(worked_session.get_absolute_url()).status_code == 404
    assert bob_client.get(f"{worked_session.get_absolute_url()}turns/1/").status_code == 404
    assert bob_client.get(f"{worked_session.get_absolute_url()}export/").status_code == 404


def test_it_shows_a_session(alice_client, worked_session):
    response = alice_client.get(worked_session.get_absolute_url())
    assert response.status_code == 200
    page = response.content.decode()
    assert "Token budget" in page
    assert 'class="seg seg--tool_results"' in page
    assert "/turns/12/" in page  # the newest turn is linked
    assert worked_session.compactions_count >= 1
    assert "## Goal" in page  # the current summary
    assert "compacted in turn" in page
    assert "truncated at stage 2" in page
    assert 'class="chip chip--live">live</span>' in page


def test_it_pages_the_messages_with_htmx(alice_client, worked_session, monkeypatch):
    from contextlab.dashboard import fragments

    monkeypatch.setattr(fragments, "MESSAGES_PER_PAGE", 5)
    response = alice_client.get(f"{worked_session.get_absolute_url()}messages/", {"page": 2},
                                headers={"HX-Request": "true", "HX-Target": "fate-panel"})
    page = response.content.decode()
    # Away from page 1 the list has its own id, so live pushes leave it alone.
    assert page.lstrip().startswith('<div id="fate-page"')
    assert "Page 2 of" in page


def test_it_shows_a_turn_with_its_steps_in_order(alice_client, worked_session):
    response = alice_client.get(f"{worked_session.get_absolute_url()}turns/2/")
    assert response.status_code == 200
    page = response.content.decode()
    positions = [page.index(f'<span class="step-name">{name}</span>')
                 for name in ("gate", "tool_result_compaction", "context_check", "result")]
    assert positions == sorted(positions)
    assert "threshold" in page


def test_it_404s_a_missing_turn(alice_client, worked_session):
    assert alice_client.get(f"{worked_session.get_absolute_url()}turns/99/").status_code == 404


def test_it_escapes_message_content(alice_client, alice_session):
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    services.messages_append(session=alice_session, messages=[{"role": "user", "content": evil}])
    services.session_prepare(session=alice_session)
    for url in (alice_session.get_absolute_url(), f"{alice_session.get_absolute_url()}turns/1/"):
        page = alice_client.get(url).content.decode()
        assert "<script>alert" not in page
        assert "<img src=x" not in page
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page


def test_it_downloads_the_bundle(alice_client, worked_session):
    response = alice_client.get(f"{worked_session.get_absolute_url()}export/")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    assert response.content[:4] == b"PK\x03\x04"
