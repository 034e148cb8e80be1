"""The compaction review on the session page: pins, a dry run's draft, accept / discard / cancel."""

from __future__ import annotations

from contextlab.sessions import services
from contextlab.sessions.models import CompactionRun, SessionMessage

HTMX = {"HX-Request": "true"}


def _url(session, rest):
    return f"{session.get_absolute_url()}{rest}"


def _draft(client, session) -> CompactionRun:
    response = client.post(_url(session, "compaction/dry-run/"), {"instruction": "keep every path"}, headers=HTMX)
    assert response.status_code == 202, response.content.decode()
    run = CompactionRun.objects.get(session=session, kind="dry_run")
    assert services.compaction_work(run_id=run.pk) == "draft"
    run.refresh_from_db()
    return run


def test_it_pins_a_fact_and_a_message_and_shows_them_in_the_panel(alice_client, compactable_session):
    session = compactable_session
    response = alice_client.post(_url(session, "pins/"), {"action": "pin_fact",
                                                           "fact": "must keep: the DB is /srv/db.sqlite"},
                                 headers=HTMX)
    assert response.status_code == 200
    live = SessionMessage.objects.filter(session=session, status="live").order_by("seq").first()
    response = alice_client.post(_url(session, "pins/"), {"action": "pin_message", "seq": live.seq}, headers=HTMX)
    panel = response.content.decode()
    assert 'data-fact="must keep: the DB is /srv/db.sqlite"' in panel
    assert f'data-pinned="{live.message_id}"' in panel
    session.refresh_from_db()
    assert services.pins_of(session).message_ids == [live.message_id]
    response = alice_client.post(_url(session, "pins/"), {"action": "unpin_fact",
                                                           "fact": "must keep: the DB is /srv/db.sqlite"},
                                 headers=HTMX)
    assert "data-fact=" not in response.content.decode()


def test_it_shows_a_pinned_message_as_pinned_when_the_message_list_is_rendered_again(alice_client,
                                                                                     compactable_session):
    # Pinning changes the state, and every state change re-renders the live message list over the
    # websocket: that list must keep saying "pinned", not offer "pin" again.
    session = compactable_session
    live = SessionMessage.objects.filter(session=session, status="live").order_by("seq").first()
    other = SessionMessage.objects.filter(session=session, status="live").order_by("-seq").first()
    alice_client.post(_url(session, "pins/"), {"action": "pin_message", "seq": live.seq}, headers=HTMX)
    listing = alice_client.get(_url(session, "messages/"), headers=HTMX).content.decode()
    assert f'data-pin-seq="{live.seq}" disabled' in listing
    assert f'data-pin-seq="{other.seq}" hx-post=' in listing


def test_it_refuses_to_pin_what_is_not_live(alice_client, compactable_session):
    archived = SessionMessage.objects.filter(session=compactable_session, status="archived").first()
    response = alice_client.post(_url(compactable_session, "pins/"),
                                 {"action": "pin_message", "message_id": archived.message_id}, headers=HTMX)
    assert response.status_code == 400 and "not in the live context" in response.content.decode()


def test_a_dry_run_shows_the_draft_and_accept_commits_it(alice_client, compactable_session):
    session = compactable_session
    before = (session.state_version, session.summary_version)
    run = _draft(alice_client, session)
    session.refresh_from_db()
    assert (session.state_version, session.summary_version) == before
    page = alice_client.get(session.get_absolute_url()).content.decode()
    assert f'id="draft" data-run="{run.pk}" data-status="draft"' in page
    assert 'id="draft-loss"' in page and 'id="accept-draft-button"' in page and 'id="draft-goes"' in page
    response = alice_client.post(_url(session, f"compaction/runs/{run.pk}/accept/"), headers=HTMX)
    assert response.status_code == 200
    session.refresh_from_db()
    assert session.summary == run.draft["draft"]["summary"] and session.summary_version == before[1] + 1


def test_a_discarded_draft_changes_nothing(alice_client, compactable_session):
    session = compactable_session
    before = (session.summary, session.summary_version, session.turns_count)
    run = _draft(alice_client, session)
    response = alice_client.post(_url(session, f"compaction/runs/{run.pk}/discard/"), headers=HTMX)
    assert response.status_code == 200 and 'id="draft"' not in response.content.decode()
    session.refresh_from_db()
    assert (session.summary, session.summary_version, session.turns_count) == before


def test_a_stale_draft_says_so_and_offers_a_new_dry_run(alice_client, compactable_session):
    session = compactable_session
    run = _draft(alice_client, session)
    services.compaction_run(session=session)
    response = alice_client.post(_url(session, f"compaction/runs/{run.pk}/accept/"), headers=HTMX)
    assert response.status_code == 409
    panel = response.content.decode()
    assert "This draft is stale" in panel and 'id="new-dry-run-button"' in panel


def test_a_queued_run_shows_a_cancel_button_and_cancels(alice_client, compactable_session):
    session = compactable_session
    response = alice_client.post(_url(session, "compaction/"), headers=HTMX)
    run = CompactionRun.objects.get(session=session)
    assert 'id="cancel-run-button"' in response.content.decode()
    response = alice_client.post(_url(session, f"compaction/runs/{run.pk}/cancel/"), headers=HTMX)
    assert response.status_code == 200
    run.refresh_from_db()
    assert run.status == "cancelled"
    assert services.compaction_work(run_id=run.pk) == "skipped"
    assert not session.turns.filter(trigger="manual").exists()


def test_the_why_answer_offers_to_pin_and_comes_back(alice_client, compactable_session):
    session = compactable_session
    page = alice_client.get(_url(session, "search?q=/srv/app/t1.log")).content.decode()
    assert 'id="pin-fact-action"' in page
    response = alice_client.post(_url(session, "pins/"), {"action": "pin_fact", "fact": "/srv/app/t1.log",
                                                           "next": _url(session, "search?q=/srv/app/t1.log")})
    assert response.status_code == 302 and response["Location"].endswith("search?q=/srv/app/t1.log")
    assert 'id="fact-pinned-mark"' in alice_client.get(_url(session, "search?q=/srv/app/t1.log")).content.decode()
    # A "next" outside the session goes back to the session page instead.
    response = alice_client.post(_url(session, "pins/"), {"action": "pin_fact", "fact": "x1",
                                                           "next": "https://evil.example/"})
    assert response["Location"] == f"{session.get_absolute_url()}#compaction-card"


def test_the_message_page_pins_a_live_message(alice_client, compactable_session):
    session = compactable_session
    live = SessionMessage.objects.filter(session=session, status="live").order_by("seq").last()
    page = alice_client.get(_url(session, f"messages/{live.seq}/")).content.decode()
    assert 'id="pin-message-button"' in page
    alice_client.post(_url(session, "pins/"), {"action": "pin_message", "message_id": live.message_id,
                                               "next": _url(session, f"messages/{live.seq}/")})
    assert 'id="pinned-mark"' in alice_client.get(_url(session, f"messages/{live.seq}/")).content.decode()


def test_another_user_cannot_pin_or_review(bob_client, compactable_session):
    assert bob_client.post(_url(compactable_session, "pins/"), {"action": "pin_fact", "fact": "x"}).status_code == 404
    assert bob_client.post(_url(compactable_session, "compaction/dry-run/")).status_code == 404


def test_a_dry_runs_loss_is_the_loss_its_accepted_version_has(alice_client, compactable_session):
    # A dry run writes no file: what its summary leaves to the identifier index is in the entry
    # accepting it will write, not lost. Codes too many for the summary's line make sure there is one.
    from contextlab.sessions.models import SummaryVersion
    from tests.conversations import many_codes

    session = compactable_session
    services.messages_append(session=session, messages=[many_codes(400)])
    services.messages_append(session=session, messages=[{"role": "user", "content": "and now the next step"}])
    run = _draft(alice_client, session)
    assert "BK399Z" not in run.draft["draft"]["summary"]  # neither the goal nor the line holds them all
    assert alice_client.post(_url(session, f"compaction/runs/{run.pk}/accept/"), headers=HTMX).status_code == 200
    session.refresh_from_db()
    version = SummaryVersion.objects.get(session=session, version=session.summary_version)
    assert version.lost_count == run.draft["lost_count"] == 0
    assert "`BK399Z`" in (session.workspace / "dialog/identifiers.md").read_text()
