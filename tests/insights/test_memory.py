"""Long-term memory pages: the session's and the profile's."""

from __future__ import annotations

import datetime as dt

from django.urls import reverse
from django.utils import timezone

from contextlab.engine.memory.long_term import MemoryNotes, append_daily_note
from tests.insights.conftest import XSS

AGENT_MEMORY = "# Long-term memory\n\n## Preferences\n- I like short commit messages\n"


def _url(session) -> str:
    return reverse("cl-insights-memory", args=[session.id])


def _note(session, text: str, *, lessons: tuple[str, ...] = ()) -> None:
    now = timezone.now()
    append_daily_note(session.workspace, MemoryNotes([text], list(lessons)), day=now.date(), now=now)


def test_a_daily_note_written_by_a_compaction_shows_up(alice_client, compacted_session):
    alice_session = compacted_session
    notes = sorted((alice_session.workspace / "memory").glob("*.md"))
    assert notes, "the compaction wrote no daily note"

    html = alice_client.get(_url(alice_session)).content.decode()
    assert f"memory/{notes[0].name}" in html
    assert "I prefer tabs over spaces in every Python file." in html


def test_consolidating_backs_up_then_writes_memory_and_shows_the_diff(alice_client, alice_session):
    (alice_session.workspace / "MEMORY.md").write_text(AGENT_MEMORY, encoding="utf-8")
    _note(alice_session, "Please always run pytest -q before committing",
          lessons=("pip install failed offline; installing from the wheel folder worked",))

    response = alice_client.post(reverse("cl-insights-memory-consolidate", args=[alice_session.id]))
    assert response.status_code == 302
    assert response["Location"].endswith("?consolidated=changed")

    backups = sorted((alice_session.workspace / "backup").glob("MEMORY-*.md"))
    assert len(backups) == 1
    assert backups[0].read_text(encoding="utf-8") == AGENT_MEMORY  # the file as it was before
    memory = (alice_session.workspace / "MEMORY.md").read_text(encoding="utf-8")
    assert "Please always run pytest -q before committing" in memory
    assert "I like short commit messages" in memory

    html = alice_client.get(response["Location"]).content.decode()
    assert "Consolidation of" in html
    added = [row for row in html.split("<tr") if "ins-diff-add" in row]
    assert any("Please always run pytest -q before committing" in row for row in added)
    assert f"backup/{backups[0].name}" in html


def test_consolidating_with_htmx_answers_the_diff_at_once(alice_client, alice_session):
    _note(alice_session, "I prefer small pull requests")
    response = alice_client.post(reverse("cl-insights-memory-consolidate", args=[alice_session.id]),
                                 headers={"HX-Request": "true"})
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="consolidation"')
    assert "There was no MEMORY.md before, so no backup." in html
    assert "ins-diff-add" in html and "I prefer small pull requests" in html
    # The rest of the page is refreshed out of band.
    assert 'id="memory-current" hx-swap-oob="true"' in html

    again = alice_client.post(reverse("cl-insights-memory-consolidate", args=[alice_session.id]),
                              headers={"HX-Request": "true"}).content.decode()
    assert "Nothing to merge" in again


def test_the_history_shows_every_consolidation(alice_client, alice_session):
    workspace = alice_session.workspace
    (workspace / "MEMORY.md").write_text(AGENT_MEMORY, encoding="utf-8")
    from contextlab.engine.memory.long_term import consolidate

    day = dt.date(2026, 3, 2)
    append_daily_note(workspace, MemoryNotes(["Always use UTC in logs"]), day=day,
                      now=dt.datetime(2026, 3, 2, 9, 0))
    consolidate(workspace, today=day, now=dt.datetime(2026, 3, 2, 23, 0))
    append_daily_note(workspace, MemoryNotes(["Never force-push to main"]), day=day + dt.timedelta(days=1),
                      now=dt.datetime(2026, 3, 3, 9, 0))
    consolidate(workspace, today=day + dt.timedelta(days=1), now=dt.datetime(2026, 3, 3, 23, 0))

    html = alice_client.get(_url(alice_session)).content.decode()
    assert "Consolidation of 2026-03-03 23:00:00" in html
    assert "Consolidation of 2026-03-02 23:00:00" in html
    assert "First version" in html
    assert html.index("2026-03-03 23:00:00") < html.index("2026-03-02 23:00:00")  # newest first


def test_memory_content_is_escaped(alice_client, alice_session):
    _note(alice_session, f"I prefer {XSS} in my notes")
    html = alice_client.get(_url(alice_session)).content.decode()
    assert XSS not in html
    assert "&lt;script&gt;" in html


def test_another_user_gets_a_404(bob_client, alice_session):
    assert bob_client.get(_url(alice_session)).status_code == 404
    assert bob_client.post(reverse("cl-insights-memory-consolidate", args=[alice_session.id])).status_code == 404
    assert not (alice_session.workspace / "MEMORY.md").exists()


def test_consolidate_is_post_only(alice_client, alice_session):
    assert alice_client.get(reverse("cl-insights-memory-consolidate", args=[alice_session.id])).status_code == 405


# -- the profile page ----------------------------------------------------------------------------


def test_the_profile_page_lists_the_memory_of_each_session(alice_client, alice_session, small_profile):
    (alice_session.workspace / "MEMORY.md").write_text(AGENT_MEMORY, encoding="utf-8")
    _note(alice_session, "Please answer in English")
    html = alice_client.get(reverse("cl-profile-memory", args=[small_profile.id])).content.decode()
    assert alice_session.display_title in html
    assert "I like short commit messages" in html
    assert reverse("cl-insights-memory", args=[alice_session.id]) in html


def test_the_profile_consolidates_every_session(alice_client, alice_session, small_profile):
    _note(alice_session, "Please answer in English")
    response = alice_client.post(reverse("cl-profile-memory-consolidate", args=[small_profile.id]),
                                 headers={"HX-Request": "true"})
    assert response.status_code == 200
    html = response.content.decode()
    assert alice_session.display_title in html
    assert "Please answer in English" in html
    assert "Please answer in English" in (alice_session.workspace / "MEMORY.md").read_text(encoding="utf-8")


def test_another_user_gets_a_404_for_the_profile(bob_client, small_profile):
    assert bob_client.get(reverse("cl-profile-memory", args=[small_profile.id])).status_code == 404
    assert bob_client.post(reverse("cl-profile-memory-consolidate", args=[small_profile.id])).status_code == 404


def test_the_profile_page_escapes_memory(alice_client, alice_session, small_profile):
    (alice_session.workspace / "MEMORY.md").write_text(f"## Preferences\n- I prefer {XSS}\n", encoding="utf-8")
    html = alice_client.get(reverse("cl-profile-memory", args=[small_profile.id])).content.decode()
    assert XSS not in html
    assert "I prefer &lt;script&gt;" in html
