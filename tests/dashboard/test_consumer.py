"""The session websocket: owner only, pushes full fragments, catches up from a cursor."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User

from contextlab.dashboard.routing import websocket_urlpatterns
from contextlab.sessions import services
from contextlab.support import live
from tests.conversations import answer, tool_turn

pytestmark = pytest.mark.django_db(transaction=True)


@database_sync_to_async
def _make_session(name: str = "alice"):
    user = User.objects.create_user(name, f"{name}@example.org", "pw")
    profile = services.profile_create(owner=user, name="small", knobs={
        "max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400})
    session = services.session_create(owner=user, system_prompt="You are careful.", profile=profile, title="ws")
    return user, session


def _communicator(session, user):
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/sessions/{session.pk}/")
    communicator.scope["user"] = user
    return communicator


async def _receive_until(communicator, needle: str, timeout: float = 5.0) -> str:
    """Everything pushed until ``needle`` arrives (the gauge goes ahead of the lists)."""
    received = ""
    while needle not in received:
        received += await communicator.receive_from(timeout=timeout)
    return received


async def test_it_refuses_anonymous_viewers():
    user, session = await _make_session()
    communicator = _communicator(session, AnonymousUser())
    connected, _ = await communicator.connect()
    # Accepted, then closed with our code (see tests/security for why).
    assert connected
    assert await communicator.receive_output() == {"type": "websocket.close", "code": 4401}


async def test_it_refuses_another_users_session():
    _, session = await _make_session("alice")
    bob = await database_sync_to_async(User.objects.create_user)("bob", "bob@example.org", "pw")
    communicator = _communicator(session, bob)
    connected, _ = await communicator.connect()
    assert connected
    assert await communicator.receive_output() == {"type": "websocket.close", "code": 4403}


async def test_it_pushes_the_gauge_when_messages_are_appended():
    user, session = await _make_session()
    communicator = _communicator(session, user)
    connected, _ = await communicator.connect()
    assert connected
    await database_sync_to_async(services.messages_append)(session=session, messages=tool_turn(1, output_bytes=300))
    await database_sync_to_async(live.flush)()
    html = await _receive_until(communicator, 'id="fate-live"')
    assert 'hx-swap-oob="true"' in html and 'id="gauge"' in html
    assert 'id="stats"' in html and 'data-messages="3"' in html
    assert 'id="fate-live"' in html
    await communicator.disconnect()


async def test_it_sends_the_gauge_alone_and_first_the_same_as_a_page_request_renders_it():
    from contextlab.dashboard import fragments

    user, session = await _make_session()
    communicator = _communicator(session, user)
    assert (await communicator.connect())[0]
    await database_sync_to_async(services.messages_append)(session=session, messages=tool_turn(1, output_bytes=300))
    await database_sync_to_async(live.flush)()
    first = await communicator.receive_from(timeout=5)
    rest = await communicator.receive_from(timeout=5)
    # The first frame is the gauge and nothing else; the lists follow in a frame of their own.
    assert first.count("hx-swap-oob") == 1 and 'id="gauge"' in first
    assert 'id="gauge"' not in rest and 'id="fate-live"' in rest and 'id="stats"' in rest
    assert first == await database_sync_to_async(fragments.push_html)(session.pk, ["gauge"])
    await communicator.disconnect()


async def test_it_pushes_every_fragment_after_a_turn():
    user, session = await _make_session()
    communicator = _communicator(session, user)
    await communicator.connect()
    await database_sync_to_async(services.messages_append)(session=session, messages=tool_turn(1, output_bytes=300))
    await database_sync_to_async(services.session_prepare)(session=session)
    await database_sync_to_async(live.flush)()
    html = await _receive_until(communicator, 'id="llm-live"')
    for element in ('id="chart-data-wrap"', 'id="turns-live"', 'id="llm-live"', 'data-turns="1"'):
        assert element in html, element
    await communicator.disconnect()


async def test_it_catches_up_a_page_that_was_away():
    user, session = await _make_session()
    for i in (1, 2):
        await database_sync_to_async(services.messages_append)(
            session=session, messages=[*([answer(i - 1)] if i > 1 else []), *tool_turn(i, output_bytes=300)])
        await database_sync_to_async(services.session_prepare)(session=session)
    # Announcements still waiting in the coalescer go out before the page connects.
    await database_sync_to_async(live.flush)()
    communicator = _communicator(session, user)
    await communicator.connect()
    await communicator.send_to(text_data=json.dumps({"type": "catch_up", "after": 1, "messages": 3}))
    html = await _receive_until(communicator, 'id="llm-live"')
    assert 'data-turns="2"' in html and 'data-turn="2"' in html
    # Up to date: only the small counters and the run panel come back.
    await communicator.send_to(text_data=json.dumps({"type": "catch_up", "after": 2, "messages": 7}))
    html = await communicator.receive_from(timeout=5)
    assert 'id="stats"' in html and 'id="flow-live"' not in html
    await communicator.disconnect()


async def test_it_rejoins_its_group_on_ping_and_ignores_garbage():
    user, session = await _make_session()
    communicator = _communicator(session, user)
    await communicator.connect()
    await communicator.send_to(text_data="not json")
    await communicator.send_to(text_data=json.dumps({"type": "ping"}))
    assert await communicator.receive_nothing(timeout=0.3)
    await database_sync_to_async(services.messages_append)(session=session, messages=tool_turn(1, output_bytes=300))
    await database_sync_to_async(live.flush)()
    assert 'id="gauge"' in await _receive_until(communicator, 'id="gauge"')
    await communicator.disconnect()


async def test_it_pushes_only_the_fragments_the_page_says_it_shows():
    user, session = await _make_session()
    communicator = _communicator(session, user)
    await communicator.connect()
    # A page with an older turn pinned: no live flow, LLM view, gauge or summary.
    shown = ["stats", "chart", "turns", "fate", "ledger", "compaction", "profile"]
    await communicator.send_to(text_data=json.dumps({"type": "view", "fragments": [*shown, "no-such-fragment"]}))
    await database_sync_to_async(services.messages_append)(session=session, messages=tool_turn(1, output_bytes=300))
    await database_sync_to_async(services.session_prepare)(session=session)
    await database_sync_to_async(live.flush)()
    html = await _receive_until(communicator, 'id="turns-live"')
    assert 'id="stats"' in html and 'id="chart-data-wrap"' in html
    for absent in ('id="flow-live"', 'id="llm-live"', 'id="gauge"', 'id="current-summary"', 'id="time-bar"'):
        assert absent not in html, absent
    await communicator.disconnect()


async def test_it_pushes_a_saved_profile_to_its_sessions_pages():
    from contextlab.dashboard.announce import profile_announce

    user, session = await _make_session()
    communicator = _communicator(session, user)
    await communicator.connect()
    profile = await database_sync_to_async(lambda: session.profile)()
    profile.compact_ratio = 0.6
    await database_sync_to_async(profile.save)()
    assert await database_sync_to_async(profile_announce)(profile) == 1
    html = await _receive_until(communicator, 'id="session-profile"')
    assert 'data-threshold="2400"' in html and 'id="gauge"' in html
    await communicator.disconnect()


async def test_it_renders_an_update_once_for_every_viewer_of_the_session(monkeypatch):
    from contextlab.dashboard import consumers, fragments

    user, session = await _make_session()
    viewers = [_communicator(session, user) for _ in range(5)]
    for viewer in viewers:
        assert (await viewer.connect())[0]
    renders: list[tuple[str, ...]] = []
    real = fragments.push_html

    def counted(session_id, names, *, key=None, event=None):
        renders.append(tuple(sorted(names)))
        return real(session_id, names, key=key, event=event)

    gauges: list[str | None] = []
    real_gauge = fragments.gauge_push

    def counted_gauge(state):
        gauges.append(real_gauge(state))
        return gauges[-1]

    # The process-wide cache of finished renders is bypassed: only sharing the render itself counts.
    monkeypatch.setattr(fragments.render_cache, "get", lambda key: None)
    monkeypatch.setattr(consumers.fragments, "push_html", counted)
    monkeypatch.setattr(consumers.fragments, "gauge_push", counted_gauge)
    await database_sync_to_async(services.messages_append)(session=session, messages=tool_turn(1, output_bytes=300))
    await database_sync_to_async(live.flush)()
    for viewer in viewers:
        html = await _receive_until(viewer, 'id="fate-live"')
        assert 'id="gauge"' in html
    # One render of the gauge (from the event, no query) and one of the rest, whatever the number of viewers.
    assert len(gauges) == 1 and gauges[0] is not None and 'id="gauge"' in gauges[0]
    assert renders == [("compaction", "fate", "ledger", "stats")]
    for viewer in viewers:
        await viewer.disconnect()
