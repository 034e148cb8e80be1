"""Importing a transcript from the browser."""

from __future__ import annotations

import json

from django.core.files.uploadedfile import SimpleUploadedFile

from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, CompactionRun
from tests.conversations import answer, tool_turn


def _transcript() -> bytes:
    messages = [{"role": "system", "content": "You are careful."}]
    for i in range(1, 5):
        messages += [*([answer(i - 1)] if i > 1 else []), *tool_turn(i, output_bytes=900)]
    return json.dumps(messages).encode()


def test_it_shows_the_upload_form(alice_client, small_profile):
    page = alice_client.get("/import/").content.decode()
    assert 'enctype="multipart/form-data"' in page and "small" in page


def test_it_replays_an_upload_in_the_background_with_progress(alice, alice_client, small_profile):
    upload = SimpleUploadedFile("run.json", _transcript(), content_type="application/json")
    response = alice_client.post("/import/", {"file": upload, "profile": small_profile.pk, "title": "Replayed"})
    assert response.status_code == 302
    session = AgentSession.objects.get(owner=alice, title="Replayed")
    assert response["Location"] == f"/import/{session.pk}/"
    assert session.status == "importing"
    progress = alice_client.get(response["Location"]).content.decode()
    assert "Replaying" in progress and 'hx-trigger="every 1s"' in progress
    total = session.source["messages"]
    assert f'data-k="total">{total}<' in progress

    run = CompactionRun.objects.get(session=session, trigger="import")
    assert services.transcript_import_work(run_id=run.pk) == "done"
    fragment = alice_client.get(response["Location"], headers={"HX-Request": "true"})
    assert fragment["HX-Redirect"] == session.get_absolute_url()
    page = fragment.content.decode()
    assert f'data-k="done">{total}<' in page and "every 1s" not in page
    session.refresh_from_db()
    assert f'data-k="turns">{session.turns_count}<' in page


def test_it_explains_bad_json_with_the_line_and_column(alice_client):
    bad = b'[\n {"role": "user", "content": "hi"},\n {"role": oops}\n]'
    response = alice_client.post("/import/", {"file": SimpleUploadedFile("bad.json", bad)})
    assert response.status_code == 400
    page = response.content.decode()
    assert "Cannot read bad.json" in page and "invalid JSON at line 3, column 11" in page
    assert not AgentSession.objects.exists()


def test_it_names_the_known_formats_for_an_unknown_one(alice_client):
    response = alice_client.post("/import/", {"file": SimpleUploadedFile("x.json", b'{"foo": 1}')})
    assert response.status_code == 400
    page = response.content.decode()
    assert "Unknown format" in page and "tau_bench" in page


def test_it_asks_for_a_file(alice_client):
    response = alice_client.post("/import/", {})
    assert response.status_code == 400
    assert "choose a transcript file" in response.content.decode()
