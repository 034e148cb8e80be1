"""The session's live view: what a commit writes for the page's live panels (the gauge's inputs,
whether "Compact now" would compact anything), so a push reads no turn or message row and a
web process never loads an engine to draw the page."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth.models import User

from contextlab.dashboard import fragments
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession
from contextlab.sessions.services import persistence
from contextlab.support import live
from tests.conversations import answer, log_output, tool_turn
from tests.dashboard.conftest import work


def _anthropic_tool_exchange(i: int) -> list[dict[str, Any]]:
    """A tool call and its result the way Anthropic's API carries them (the result in a user message)."""
    return [
        {"role": "assistant", "content": [{"type": "text", "text": f"Reading log {i}."},
                                          {"type": "tool_use", "id": f"toolu_{i}", "name": "read_file",
                                           "input": {"path": f"/srv/app/t{i}.log"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                      "content": log_output(600, tag=f"r{i}")}]},
    ]


def _gauges(session_id: Any) -> tuple[str, str]:
    """The gauge push from the session's live view, and the same push read from the rows."""
    from_view = fragments.push_html(session_id, ["gauge"])
    session = AgentSession.objects.select_related("profile").get(pk=session_id)
    session.live_view = {}
    return str(from_view), fragments.render_fragments(session, ["gauge"])


@pytest.mark.django_db(transaction=True)
async def test_it_renders_the_same_gauge_from_the_event_the_view_and_the_rows():
    user = await database_sync_to_async(User.objects.create_user)("alice", "alice@example.org", "pw")
    profile = await database_sync_to_async(services.profile_create)(owner=user, name="small", knobs={
        "max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400})
    session = await database_sync_to_async(services.session_create)(
        owner=user, system_prompt="You are careful.", profile=profile, title="gauge")
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(live.session_group(session.pk), channel)

    async def step(action: Any) -> dict[str, Any]:
        await database_sync_to_async(action)()
        await database_sync_to_async(live.flush)()
        # The newest state the step announced (a step of ``work`` commits twice).
        states: list[dict[str, Any]] = []
        while True:
            try:
                event = await asyncio.wait_for(layer.receive(channel), timeout=0.5 if states else 5)
            except TimeoutError:
                break
            if event["type"] == "gauge.update":
                states.append(dict(event["state"]))
        return states[-1]

    steps: list[Callable[[], object]] = [
        # No turn yet: the system prompt and the messages appended.
        lambda: services.messages_append(session=session, messages=[{"role": "user", "content": "Fix the build."}]),
        lambda: services.messages_append(session=session, messages=tool_turn(1, output_bytes=900)[1:]),
        lambda: services.session_prepare(session=session),
        # After a turn: what was appended since, tool results (OpenAI's and Anthropic's) apart.
        lambda: services.messages_append(session=session, messages=[answer(1), *tool_turn(2, output_bytes=700)]),
        lambda: services.messages_append(session=session, messages=_anthropic_tool_exchange(3)),
    ]
    # Enough turns on the small window to compact, then an append on top of the compaction.
    steps += [functools.partial(work, session, 1, first=i, output_bytes=1_500) for i in range(4, 14)]
    steps.append(lambda: services.messages_append(session=session, messages=[answer(13), *tool_turn(14)]))
    seen_pending_tools = False
    for action in steps:
        state = await step(action)
        from_event = fragments.gauge_push(state)
        from_view, from_rows = await database_sync_to_async(_gauges)(session.pk)
        assert from_event == from_view == from_rows
        pending = state["gauge"]["pending"]
        seen_pending_tools |= pending["tool_results"] > 0 and pending["count"] > 0
    assert seen_pending_tools
    refreshed = await database_sync_to_async(AgentSession.objects.get)(pk=session.pk)
    assert refreshed.compactions_count >= 1
    assert refreshed.live_view["version"] == refreshed.state_version


def _no_engine_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record any load of an engine from the database (the engines kept in this process are dropped)."""
    persistence.engines.clear()
    loads: list[str] = []
    real = persistence.load_manager

    def recorded(session: AgentSession) -> Any:
        loads.append(str(session.pk))
        return real(session)

    monkeypatch.setattr(persistence, "load_manager", recorded)
    return loads


def _engine_blocker(session: AgentSession) -> bool:
    return not services.compaction_preview(session=session)["compact_ids"]


def test_it_tells_whether_compact_now_works_without_loading_an_engine(alice_session, monkeypatch):
    services.messages_append(session=alice_session, messages=tool_turn(1, output_bytes=300))
    alice_session.refresh_from_db()
    loads = _no_engine_loads(monkeypatch)
    blocker = fragments.compaction_blocker(alice_session)
    html = fragments.push_html(alice_session.pk, ["compaction"])
    assert loads == []
    # One request: nothing before it to summarise, and the page says so.
    assert blocker is not None and blocker.startswith("nothing to compact: the 3 live messages fit")
    assert blocker in str(html) and "disabled" in str(html)
    assert _engine_blocker(alice_session)

    work(alice_session, 3, first=2)
    loads.clear()
    persistence.engines.clear()
    assert fragments.compaction_blocker(alice_session) is None
    assert 'id="compact-blocker"' not in str(fragments.push_html(alice_session.pk, ["compaction"]))
    assert loads == []
    assert not _engine_blocker(alice_session)


def test_it_asks_the_engine_once_the_profile_moved_since_the_commit(alice_session, monkeypatch):
    work(alice_session, 3)
    alice_session.refresh_from_db()
    view_answer = fragments.compaction_blocker(alice_session)
    profile = alice_session.profile
    profile.compact_ratio, profile.reserve_ratio = 0.9, 0.5
    profile.save(changed_by=alice_session.owner, change_source="test")
    alice_session.refresh_from_db()
    loads = _no_engine_loads(monkeypatch)
    # The view was computed under the old profile: the engine answers, under the new one.
    answer_now = fragments.compaction_blocker(alice_session)
    assert loads == [str(alice_session.pk)]
    assert (answer_now is None) == (not _engine_blocker(alice_session))
    assert view_answer is None
    # The next commit writes a view for the new profile, and the page stops asking.
    services.messages_append(session=alice_session, messages=[{"role": "user", "content": "and now?"}])
    alice_session.refresh_from_db()
    loads.clear()
    persistence.engines.clear()
    from_view = fragments.compaction_blocker(alice_session)
    assert loads == []
    assert (from_view is None) == (not _engine_blocker(alice_session))
    assert json.dumps(alice_session.live_view["profile"]) == json.dumps([profile.pk, profile.version])
