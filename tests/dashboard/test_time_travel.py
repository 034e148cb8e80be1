"""Time travel: the panels of the session page at one turn."""

from __future__ import annotations

from contextlab.dashboard import timetravel
from contextlab.sessions.models import OffloadedFile, SessionMessage, Turn


def _at(client, session, turn):
    return client.get(f"{session.get_absolute_url()}at/", {"turn": turn}).content.decode()


def test_it_shows_every_panel_pinned_at_a_turn(alice_client, worked_session):
    turn = Turn.objects.filter(session=worked_session, outcome="compacted").order_by("number").first()
    page = _at(alice_client, worked_session, turn.number)
    assert page.lstrip().startswith('<div id="time-bar"')
    for panel in ("gauge-panel", "flow-panel", "llm-panel", "fate-panel", "ledger-panel", "summary-panel"):
        assert f'<div id="{panel}" hx-swap-oob="innerHTML">' in page
    for pinned in ("gauge-pinned", "flow-pinned", "llm-pinned", "fate-page", "ledger-page", "summary-pinned"):
        assert f'id="{pinned}"' in page
    # Nothing pinned says it is live, so no push targets it.
    assert "data-live-fragment" not in page


def test_the_latest_brings_the_live_panels_back(alice_client, worked_session):
    page = _at(alice_client, worked_session, "latest")
    for live in ("gauge", "flow", "llm", "fate", "ledger", "summary", "timebar"):
        assert f'data-live-fragment="{live}"' in page


def test_the_messages_at_a_turn_are_those_seen_by_then_each_where_it_was(worked_session):
    turn = Turn.objects.filter(session=worked_session, outcome="compacted").order_by("number").first()
    context = timetravel.fate_at(worked_session, turn)
    last = SessionMessage.objects.get(session=worked_session, message_id=turn.trace["payload"]["last_message_id"])
    seqs = [item["row"].seq for item in context["fate_rows"]]
    assert seqs[0] == last.seq and all(seq <= last.seq for seq in seqs)
    later = SessionMessage.objects.filter(session=worked_session, compacted_turn__gt=turn.number,
                                          seq__lte=last.seq).values_list("seq", flat=True)
    assert later, "a message compacted after this turn was still live at it"
    for item in context["fate_rows"]:
        row = item["row"]
        if row.seq in later:
            assert row.status == "live"
            assert not any(e["kind"] in ("compacted", "archived") for e in item["events"])


def test_the_ledger_at_a_turn_leaves_out_cuts_made_later(worked_session):
    early = Turn.objects.get(session=worked_session, number=3)
    shown = {row["file"].path for row in timetravel.ledger_at(worked_session, early)["ledger_rows"]}
    all_files = set(OffloadedFile.objects.filter(session=worked_session).values_list("path", flat=True))
    assert shown and shown < all_files
    for path in shown:
        file = OffloadedFile.objects.get(session=worked_session, path=path)
        message = SessionMessage.objects.get(session=worked_session, message_id=file.message_id)
        assert file.stage == 1 or message.truncated_turn <= early.number


def test_the_pinned_pagers_keep_the_turn(alice_client, worked_session):
    page = alice_client.get(f"{worked_session.get_absolute_url()}messages/", {"turn": 8, "page": 2}).content.decode()
    assert 'id="fate-page" data-turn="8"' in page
