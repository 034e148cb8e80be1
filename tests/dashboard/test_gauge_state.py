"""The gauge and the decision flow tell one story: past the threshold, the gauge says what the turn decided."""

from __future__ import annotations

import html

from contextlab.dashboard import fragments
from contextlab.sessions import services
from tests.dashboard.conftest import defer_a_turn


def _url(session, rest=""):
    return f"{session.get_absolute_url()}{rest}"


def _gauge(page: str) -> str:
    return page[page.index('id="gauge"'):page.index('id="chart-card"')]


def test_it_says_deferred_and_why_when_the_flow_deferred(alice_client, worked_session):
    turn = defer_a_turn(worked_session)
    flow_reason = next(step["outcome"] for step in turn.trace["steps"] if "deferred:" in step.get("outcome", ""))
    page = alice_client.get(_url(worked_session)).content.decode()
    gauge = html.unescape(_gauge(page))
    assert "compaction due" not in gauge
    assert f"over the threshold — deferred at turn {turn.number}" in gauge
    assert flow_reason.split("deferred:", 1)[1].strip() in gauge
    assert f'href="turns/{turn.number}/"' in gauge
    # The flow of the same turn says the same.
    assert "compaction deferred" in page[page.index('id="flow-live"'):]


def test_it_says_the_same_in_a_pushed_gauge_and_at_a_past_turn(alice_client, worked_session):
    turn = defer_a_turn(worked_session)
    view = services.current_live_view(worked_session)
    assert view is not None and view["gauge"]["held_back"] == "deferred"
    pushed = fragments.gauge_push({"gauge": view["gauge"], "tokens": {
        "window": worked_session.profile.max_input_length, "threshold": worked_session.profile.threshold,
        "reserve": worked_session.profile.reserve}})
    assert pushed is not None and f"deferred at turn {turn.number}" in pushed
    at = alice_client.get(_url(worked_session, f"at/?turn={turn.number}"), HTTP_HX_REQUEST="true").content.decode()
    assert f"deferred at turn {turn.number}" in at


def test_it_draws_the_reserve_at_the_tail_of_the_messages_not_in_the_system_prompt(worked_session):
    latest = worked_session.turns.order_by("-number").first()
    gauge = fragments.gauge_context(worked_session, latest)["gauge"]
    fixed = sum(seg["tokens"] for seg in gauge["segments"] if seg["key"] in ("system", "summary", "tools"))
    scale = max(gauge["window"], gauge["total"])
    assert gauge["reserve_percent"] == round(100 * max(fixed, gauge["total"] - gauge["reserve"]) / scale, 3)
    assert gauge["reserve_percent"] >= round(100 * fixed / scale, 3)


def test_it_shows_a_deferred_turn_as_deferred_in_the_turn_list_and_the_flow(alice_client, worked_session):
    turn = defer_a_turn(worked_session)
    assert turn.outcome == "no_action"  # nothing compacted: the stored outcome stays, the page says why
    why = next(step["outcome"] for step in turn.trace["steps"]
               if "deferred:" in step.get("outcome", "")).split("deferred:", 1)[1].strip()
    page = alice_client.get(_url(worked_session)).content.decode()
    rows = page[page.index('id="turn-rows"'):]
    row = rows[rows.index(f'data-turn="{turn.number}"'):]
    row = row[:row.index("</tr>")]
    assert 'data-held-back="deferred"' in row and ">deferred</span>" in row
    assert ">no_action<" not in row
    assert f'title="compaction held back: {why}"' in row.replace("&lt;", "<").replace("&gt;", ">")
    # A turn under the threshold still says no_action.
    quiet = worked_session.turns.filter(outcome="no_action").order_by("number").first()
    first = rows[rows.index(f'data-turn="{quiet.number}"'):] if f'data-turn="{quiet.number}"' in rows else ""
    if first:
        assert ">no_action<" in first[:first.index("</tr>")]
    # The flow of that turn: its branch says the compaction was held back, and why.
    flow = fragments.flow_context(worked_session, turn, live=False)["flow"]
    assert flow.deferred_why == why
    assert flow.nodes["branch"].outcome.startswith("no, but held back:")
    assert flow.nodes["skip"].state == "taken"
    assert flow.nodes["skip"].outcome == f"compaction held back (deferred): {why}"
    at = alice_client.get(_url(worked_session, f"at/?turn={turn.number}"), HTTP_HX_REQUEST="true").content.decode()
    assert 'data-held-back="deferred"' in at and "compaction held back (deferred)" in at
