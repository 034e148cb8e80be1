"""Policy comparison and the eviction plans."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from contextlab.insights.services import COMPARE_DIR, RESULT_FILE
from contextlab.sessions import services
from tests.corpus import corpus_path
from tests.insights.conftest import XSS

TAU = "tau-bench/gpt-4o-airline.idx52.task2.trial1.json"
POLICIES = ("contextlab", "copaw", "lowest_score_first", "sliding_window", "hierarchical_quota")


def _url(session, name: str = "cl-insights-compare") -> str:
    return reverse(name, args=[session.id])


def _policy_sections(html: str) -> dict[str, str]:
    parts = html.split('<section class="card ins-policy">')[1:]
    out: dict[str, str] = {}
    for part in parts:
        match = re.search(r'ins-series--(\w+)"></span>', part)
        assert match
        out[match.group(1)] = part.split("</section>")[0]
    return out


@pytest.fixture
def tau_session(alice, small_profile):
    return services.transcript_import(owner=alice, path=corpus_path(TAU), profile=small_profile)


@pytest.mark.corpus
def test_it_compares_all_five_policies_on_a_small_window(alice_client, tau_session):
    response = alice_client.post(_url(tau_session, "cl-insights-compare-run"), {"window": ""},
                                 headers={"HX-Request": "true"})
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="comparison">')
    sections = _policy_sections(html)
    assert set(sections) == set(POLICIES)
    for name in ("contextlab", "lowest_score_first", "sliding_window", "hierarchical_quota"):
        assert "nothing lost" in sections[name], name
    # One SVG polyline per policy in the overview, plus one in each policy's own chart.
    assert html.count('<polyline class="ins-series ins-series--contextlab"') == 2
    assert "window 4,000" in html and "threshold 2,800" in html
    # Each strategy says what it removed, with reasons.
    assert "drop" in sections["lowest_score_first"] and "cut-off" in sections["lowest_score_first"]

    cached = json.loads((tau_session.workspace / COMPARE_DIR / RESULT_FILE).read_text(encoding="utf-8"))
    assert [p["name"] for p in cached["policies"]] == list(POLICIES)
    assert cached["window"] == 4_000
    # Only the result is kept: the five replays' folders are gone.
    assert [p.name for p in (tau_session.workspace / COMPARE_DIR).iterdir()] == [RESULT_FILE]

    # The page shows the cached result on the next visit, without running again.
    page = alice_client.get(_url(tau_session)).content.decode()
    assert set(_policy_sections(page)) == set(POLICIES)
    assert "Run again" in page
    assert "changed since this comparison" not in page


@pytest.mark.corpus
def test_a_comparison_with_another_window_and_without_htmx(alice_client, tau_session):
    response = alice_client.post(_url(tau_session, "cl-insights-compare-run"), {"window": "20000"})
    assert response.status_code == 302
    page = alice_client.get(response["Location"]).content.decode()
    assert "window 20,000" in page and "(instead of the profile's)" in page


def test_a_bad_window_is_refused(alice_client, tool_session):
    response = alice_client.post(_url(tool_session, "cl-insights-compare-run"), {"window": "12"},
                                 headers={"HX-Request": "true"})
    assert response.status_code == 400
    assert "form-error" in response.content.decode()


def test_an_empty_session_has_nothing_to_replay(alice_client, alice_session):
    response = alice_client.post(_url(alice_session, "cl-insights-compare-run"), headers={"HX-Request": "true"})
    assert response.status_code == 400
    assert "no messages to replay" in response.content.decode()


def test_a_small_session_compares_and_escapes_its_content(alice_client, tool_session):
    response = alice_client.post(_url(tool_session, "cl-insights-compare-run"), headers={"HX-Request": "true"})
    assert response.status_code == 200
    html = response.content.decode()
    assert set(_policy_sections(html)) == set(POLICIES)
    assert XSS not in html


def test_the_comparison_is_marked_outdated_when_the_session_grows(alice_client, tool_session):
    alice_client.post(_url(tool_session, "cl-insights-compare-run"), headers={"HX-Request": "true"})
    services.messages_append(session=tool_session, messages=[{"role": "user", "content": "And the docs?"}])
    page = alice_client.get(_url(tool_session)).content.decode()
    assert "changed since this comparison" in page


def test_another_user_gets_a_404(bob_client, tool_session):
    assert bob_client.get(_url(tool_session)).status_code == 404
    assert bob_client.post(_url(tool_session, "cl-insights-compare-run")).status_code == 404


def test_it_shows_the_eviction_plans_of_an_eviction_session(alice, alice_client):
    profile = services.profile_create(owner=alice, name="evicting", knobs={
        "policy": "eviction", "max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500,
        "old_max_bytes": 400})
    session = services.session_create(owner=alice, system_prompt="You are an agent.", profile=profile)
    from tests.conversations import answer, tool_turn

    messages = [{"role": "user", "content": "Build every target and report."}]
    for i in range(1, 10):
        messages += [*tool_turn(i, output_bytes=1_400), answer(i)]
        services.messages_append(session=session, messages=messages)
        services.session_prepare(session=session)
        messages = []
    session.refresh_from_db()
    assert session.turns.filter(outcome="evicted").exists()
    html = alice_client.get(_url(session)).content.decode()
    assert "Eviction plans of this session" in html
    plans = html[html.index('id="eviction-plans"'):]
    assert "lowest_score_first" in plans
    assert re.search(r'class="chip chip--warning">drop<|class="chip ins-chip--ext">externalize<|'
                     r'class="chip chip--fired">summarize<', plans)
    assert "units kept" in plans or "unit kept" in plans
