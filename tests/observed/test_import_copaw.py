"""A CoPaw workspace or a folder of requests, uploaded, becomes a session the pages draw."""

from __future__ import annotations

from pathlib import Path

from django.core.files.uploadedfile import SimpleUploadedFile

from contextlab.sessions.models import AgentSession, SessionMessage, SummaryVersion, Turn
from tests.observed.copaw import analysis, zip_of


def _upload(path: Path) -> SimpleUploadedFile:
    return SimpleUploadedFile(path.name, path.read_bytes(), content_type="application/zip")


def test_it_builds_the_session_of_a_workspace_zip_with_its_requests(api, alice, tmp_path: Path) -> None:
    expected = analysis()
    response = api.client.post("/api/v1/imports", {"file": _upload(zip_of(tmp_path / "copaw.zip"))},
                               headers=api.headers)
    assert response.status_code == 201, response.content
    session = AgentSession.objects.get(pk=response.json()["id"])
    report = session.source["report"]
    assert session.source["format"] == "copaw_workspace"
    assert report["compactions"] == 4 and report["manual_compactions"] == 1
    assert report["live_messages"] == expected["session_live_messages"]
    assert report["truncated_tool_results"] == expected["tool_results_shrunk_any_way"]
    assert session.profile.policy == "copaw" and session.profile.max_input_length == 12000
    assert session.profile.recent_n == 2 and session.profile.old_max_bytes == 1000
    turns = Turn.objects.filter(session=session)
    assert turns.count() == expected["requests_by_kind"]["agent"]
    compacted = [t.trace["observed"]["request"] for t in turns.filter(outcome="compacted").order_by("number")]
    assert compacted == [w["from_seq"] for w in expected["summary_wrapper_changes"]]
    assert [t.trigger for t in turns.filter(outcome="compacted").order_by("number")] == [
        "auto", "auto", "manual", "auto"]
    versions = SummaryVersion.objects.filter(session=session).order_by("version")
    assert [v.version for v in versions] == [1, 2, 3, 4]
    assert len(versions.last().text) == expected["session_summary_chars"]
    archived = SessionMessage.objects.filter(session=session, compacted_turn__isnull=False).count()
    assert archived == sum(expected["dialog_files"].values())
    assert session.compactions_count == 4


def test_it_draws_the_observed_session_in_the_existing_pages(alice_client, api, tmp_path: Path) -> None:
    response = api.client.post("/api/v1/imports", {"file": _upload(zip_of(tmp_path / "copaw.zip"))},
                               headers=api.headers)
    session = AgentSession.objects.get(pk=response.json()["id"])
    compaction = Turn.objects.get(session=session, outcome="compacted", trace__observed__request=40)
    page = alice_client.get(f"/sessions/{session.pk}/turns/{compaction.number}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "33" in text and "summary v2" in text
    summaries = alice_client.get(f"/sessions/{session.pk}/summaries/?v=2")
    assert summaries.status_code == 200
    diff = summaries.content.decode()
    assert "v2 against v1" in diff and "agent (request 38)" in diff and "<ins>" in diff
    base = f"/sessions/{session.pk}"
    for page_url in (session.get_absolute_url(), f"{base}/turns/", f"{base}/turns/1/", f"{base}/ledger/",
                     f"{base}/messages/", f"{base}/messages/3/", f"{base}/payload/", f"{base}/inspect/",
                     f"{base}/search?q=seq"):
        assert alice_client.get(page_url).status_code == 200, page_url
    ledger = alice_client.get(f"{base}/ledger/").content.decode()
    assert "tool_result/" in ledger


def test_it_imports_a_zip_of_requests_from_the_import_page(alice, alice_client, tmp_path: Path) -> None:
    archive = zip_of(tmp_path / "requests.zip", workspace=False)
    response = alice_client.post("/import/", {"file": _upload(archive), "title": "From the log"})
    assert response.status_code == 302
    session = AgentSession.objects.get(owner=alice, title="From the log")
    assert response["Location"] == session.get_absolute_url()
    assert session.source["format"] == "requests" and session.source["requests"] == 75
    assert session.compactions_count == 4 and session.turns_count == 59


def test_it_imports_a_workspace_without_requests_as_its_messages(api, tmp_path: Path) -> None:
    expected = analysis()
    archive = zip_of(tmp_path / "ws.zip", requests=False)
    response = api.client.post("/api/v1/imports", {"file": _upload(archive)}, headers=api.headers)
    assert response.status_code == 201
    session = AgentSession.objects.get(pk=response.json()["id"])
    assert session.live_count == expected["session_live_messages"]
    assert SessionMessage.objects.filter(session=session, status="archived").count() == 101
    assert session.summary_version == 1 and len(session.summary) == expected["session_summary_chars"]
    assert any("without the request log" in w for w in session.source["warnings"])


def test_it_shows_the_agents_memory_files_in_the_memory_page(alice_client, api, tmp_path: Path) -> None:
    response = api.client.post("/api/v1/imports", {"file": _upload(zip_of(tmp_path / "ws.zip", requests=False))},
                               headers=api.headers)
    session = AgentSession.objects.get(pk=response.json()["id"])
    page = alice_client.get(f"/sessions/{session.pk}/insights/memory/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "Flush at request 0017" in text and "Tool Setup" in text
