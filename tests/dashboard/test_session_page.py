"""The live session page and its fragments, through the Django test client."""

from __future__ import annotations

import re

import pytest

from contextlab.dashboard import fragments
from contextlab.sessions import services
from contextlab.sessions.models import SessionMessage, Turn
from tests.conversations import tool_turn
from tests.dashboard.conftest import WORKED_TURNS, work


def _url(session, rest=""):
    return f"{session.get_absolute_url()}{rest}"


def test_it_requires_login(client, alice_session):
    for rest in ("", "turns/", "inspect/", "payload/", "messages/", "ledger/", "summaries/", "search?q=x",
                 "compaction/preview/"):
        response = client.get(_url(alice_session, rest))
        assert response.status_code == 302, rest
        assert response["Location"].startswith("/accounts/login/")


def test_it_hides_every_fragment_from_another_user(bob_client, worked_session):
    for rest in ("", "turns/", "turns/?after=0", "inspect/?turn=2", "payload/?turn=2", "messages/", "ledger/",
                 "messages/1/", "summaries/", "search?q=build", "compaction/preview/",
                 "files/dialog/x.jsonl"):
        assert bob_client.get(_url(worked_session, rest)).status_code == 404, rest
    assert bob_client.post(_url(worked_session, "compaction/")).status_code == 404


def test_it_shows_every_part_of_the_page(alice_client, worked_session):
    page = alice_client.get(_url(worked_session)).content.decode()
    for element in ('id="live-socket"', 'ws-connect="/ws/sessions/', 'id="stats"', 'id="gauge"', 'id="chart-data"',
                    'id="turns-live"', 'id="flow-live"', 'id="llm-live"', 'id="compaction"', 'id="ledger-live"',
                    'id="fate-live"', 'id="current-summary"'):
        assert element in page, element
    assert "uPlot.iife.min-1.6.32.js" in page


def test_it_splits_the_gauge_by_layer_as_the_latest_turn_measured(alice_client, worked_session):
    latest = worked_session.turns.order_by("-number").first()
    layers = latest.layer_tokens()
    page = alice_client.get(_url(worked_session)).content.decode()
    gauge = page[page.index('id="gauge"'):page.index('id="chart-card"')]
    for key in ("system", "summary", "messages", "tool_results"):
        assert re.search(rf'data-layer="{key}">.*?<strong>{layers[key]:,}</strong>', gauge, re.S), key
    assert f'data-total="{layers["total"]}"' in gauge
    assert f"{worked_session.profile.threshold:,}" in gauge and f"{worked_session.profile.reserve:,}" in gauge
    assert "marker--threshold" in gauge and "marker--reserve" in gauge


def test_it_moves_the_gauge_when_messages_arrive_before_any_turn(alice_client, worked_session):
    before = fragments.gauge_context(worked_session, fragments.latest_turn(worked_session))["gauge"]
    services.messages_append(session=worked_session, messages=[{"role": "user", "content": "one more thing " * 40}])
    worked_session.refresh_from_db()  # as a page reads it: the committed row
    after = fragments.gauge_context(worked_session, fragments.latest_turn(worked_session))["gauge"]
    added = SessionMessage.objects.filter(session=worked_session).order_by("-seq").first().tokens
    assert after["total"] == before["total"] + added
    assert after["pending"] == 1
    page = alice_client.get(_url(worked_session)).content.decode()
    assert "1 message appended since" in page


def test_it_turns_the_gauge_red_over_the_threshold(alice_client, alice_session):
    services.messages_append(session=alice_session, messages=tool_turn(1, output_bytes=1_400) * 1)
    services.messages_append(session=alice_session, messages=[
        {"role": "assistant", "content": "x " * 1_500}, {"role": "user", "content": "y " * 1_500}])
    gauge = fragments.gauge_context(alice_session, None)["gauge"]
    assert gauge["over_threshold"]
    page = alice_client.get(_url(alice_session)).content.decode()
    assert "gauge--over" in page or "gauge--overflow" in page


def test_it_shows_the_flow_of_any_turn_with_its_llm_view_out_of_band(alice_client, worked_session):
    turn = Turn.objects.filter(session=worked_session, outcome="compacted").order_by("number").first()
    response = alice_client.get(_url(worked_session, f"inspect/?turn={turn.number}"), headers={"HX-Request": "true"})
    page = response.content.decode()
    assert page.lstrip().startswith('<div id="flow-pinned"')
    assert '<div id="llm-panel" hx-swap-oob="innerHTML">' in page and 'id="llm-pinned"' in page
    steps = {s["step"]: s for s in turn.trace["steps"]}
    assert f'data-k="to compact">{steps["context_check"]["numbers"]["compact_count"]:,}<' in page
    assert f'data-k="archived">{steps["mark_compressed"]["numbers"]["archived"]:,}<' in page
    assert 'data-node="initial" data-state="fired"' in page or 'data-node="incremental" data-state="fired"' in page
    assert 'data-node="skip" data-state="skipped"' in page


def test_it_follows_the_latest_turn_when_asked(alice_client, worked_session):
    page = alice_client.get(_url(worked_session, "inspect/?turn=latest")).content.decode()
    assert page.lstrip().startswith('<div id="flow-live"')
    assert f'data-turn="{worked_session.turns_count}"' in page


def test_it_404s_a_turn_that_does_not_exist(alice_client, worked_session):
    assert alice_client.get(_url(worked_session, "inspect/?turn=999")).status_code == 404


def test_it_catches_up_from_a_cursor(alice_client, worked_session):
    last = WORKED_TURNS
    response = alice_client.get(_url(worked_session, f"turns/?after={last - 3}"))
    page = response.content.decode()
    assert re.findall(r'data-turn="(\d+)"', page) == [str(last), str(last - 1), str(last - 2)]
    assert response["X-Last-Turn"] == str(last)
    assert alice_client.get(_url(worked_session, f"turns/?after={last}")).content.decode().count("data-turn=") == 0


def test_it_pages_and_filters_the_turn_selector(alice_client, worked_session, monkeypatch):
    monkeypatch.setattr(fragments, "TURNS_PER_PAGE", 5)
    page = alice_client.get(_url(worked_session, "turns/?page=2")).content.decode()
    assert page.lstrip().startswith('<div id="turns-page"')
    # Page 2 of five per page, newest first.
    assert re.findall(r'data-turn="(\d+)"', page) == [str(n) for n in range(WORKED_TURNS - 5, WORKED_TURNS - 10, -1)]
    compacted = alice_client.get(_url(worked_session, "turns/?outcome=compacted")).content.decode()
    numbers = {int(n) for n in re.findall(r'data-turn="(\d+)"', compacted)}
    assert numbers == set(Turn.objects.filter(session=worked_session, outcome="compacted")
                          .values_list("number", flat=True))


def test_it_colours_the_payload_by_layer_and_diffs_it_against_the_turn_before(alice_client, worked_session):
    turn = Turn.objects.filter(session=worked_session, outcome="compacted").order_by("number").last()
    page = alice_client.get(_url(worked_session, f"payload/?turn={turn.number}")).content.decode()
    assert 'data-layer="system"' in page and 'data-layer="summary"' in page and 'data-layer="tool_results"' in page
    assert 'data-status="removed"' in page  # the compacted messages left the payload
    assert 'data-status="changed"' in page  # the summary was rewritten
    assert f"against turn {turn.number - 1}" in page


def test_it_windows_the_payload_list(alice_client, worked_session, monkeypatch):
    monkeypatch.setattr(fragments, "PAYLOAD_ROWS_PER_PAGE", 3)
    page = alice_client.get(_url(worked_session, "payload/?turn=4&page=2")).content.decode()
    assert page.count('class="pmsg ') == 3
    assert "Rows 4–6 of" in page


def test_it_lists_message_fates_newest_first_a_page_at_a_time(alice_client, worked_session, monkeypatch):
    monkeypatch.setattr(fragments, "MESSAGES_PER_PAGE", 10)
    page = alice_client.get(_url(worked_session)).content.decode()
    fate = page[page.index('id="fate-live"'):]
    seqs = [int(n) for n in re.findall(r'data-seq="(\d+)"', fate)]
    assert seqs == list(range(worked_session.messages_count, worked_session.messages_count - 10, -1))
    archived = SessionMessage.objects.filter(session=worked_session, status="archived").order_by("seq").first()
    older = alice_client.get(_url(worked_session, f"messages/?page={(worked_session.messages_count - archived.seq) // 10 + 1}")).content.decode()
    assert f"archived at {archived.archive_file}:{archived.archive_line}" in older
    assert f"compacted in turn {archived.compacted_turn} into summary v{archived.summary_version}" in older
    assert f"files/{archived.archive_file}?line={archived.archive_line}" in older


def test_it_lists_the_truncation_ledger(alice_client, worked_session):
    page = alice_client.get(_url(worked_session, "ledger/")).content.decode()
    file = worked_session.offloaded_files.order_by("-pk").first()
    assert f"files/{file.path}" in page
    assert f"{file.bytes:,} → {file.kept_bytes:,}" in page
    assert file.expires_at.strftime("%Y-%m-%d") in page


def test_it_shows_a_message_with_its_original_and_archived_record(alice_client, worked_session):
    message = (SessionMessage.objects.filter(session=worked_session, status="archived", role="tool")
               .order_by("seq").first())
    page = alice_client.get(_url(worked_session, f"messages/{message.seq}/")).content.decode()
    assert "Archived record" in page and f"{message.archive_file}:{message.archive_line}" in page
    assert "As ingested" in page
    assert "[t1] step 0001" in page
    assert alice_client.get(_url(worked_session, "messages/9999/")).status_code == 404


@pytest.mark.parametrize("name", fragments.FRAGMENTS)
def test_it_renders_each_fragment_alone_for_an_oob_swap(worked_session, name):
    html = fragments.render_fragments(worked_session, [name])
    first = re.match(r'\s*<(\w+) id="([\w-]+)"', html)
    assert first, html[:200]
    assert 'hx-swap-oob="true"' in html[:400]


def test_it_renders_a_push_once_for_every_viewer(worked_session, django_assert_max_num_queries):
    first = fragments.push_html(worked_session.pk, ["gauge", "stats"], key="event-1")
    with django_assert_max_num_queries(0):
        assert fragments.push_html(worked_session.pk, ["stats", "gauge"], key="event-1") == first


def test_it_keeps_an_empty_session_readable(alice_client, alice_session):
    page = alice_client.get(_url(alice_session)).content.decode()
    assert "No turn yet" in page and "No messages yet" in page
    work(alice_session, 1)
    assert "No turn yet" not in alice_client.get(_url(alice_session)).content.decode()


def test_it_shows_the_tool_schema_layer_in_the_gauge_and_the_payload(alice_client, alice_session):
    tools = [{"type": "function", "function": {"name": f"step_{i}", "description": "Run one build step.",
                                               "parameters": {"type": "object", "properties": {
                                                   "target": {"type": "string"}}}}} for i in range(10)]
    services.session_advance(session=alice_session, messages=[{"role": "user", "content": "build it"}],
                             request_schemas=(tools, None))
    layers = alice_session.turns.get().layer_tokens()
    assert layers["tools"] > 0
    page = alice_client.get(_url(alice_session)).content.decode()
    gauge = page[page.index('id="gauge"'):page.index('id="chart-card"')]
    assert re.search(rf'data-layer="tools">.*?tool schemas <strong>{layers["tools"]:,}</strong>', gauge, re.S)
    assert 'class="seg seg--tools"' in gauge
    llm = page[page.index('id="llm-live"'):]
    assert f'seg--tools"></span>tool schemas <strong>{layers["tools"]:,}</strong>' in llm
