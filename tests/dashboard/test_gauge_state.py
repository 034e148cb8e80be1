"""The gauge and the decision flow tell one story: past the threshold, the gauge says what the turn decided."""

from __future__ import annotations

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
    gauge = _gauge(page)
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
