"""A session under the copaw policy goes through the same services."""

from __future__ import annotations

from contextlab.sessions import services
from contextlab.sessions.models import SessionMessage
from contextlab.sessions.services.persistence import stored_live_ids
from tests.conversations import answer, tool_turn


def test_it_runs_and_records_a_copaw_session(alice):
    profile = services.profile_create(owner=alice, name="copaw", knobs={
        "policy": "copaw", "max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500,
        "old_max_bytes": 400})
    session = services.session_create(owner=alice, system_prompt="You are CoPaw.", profile=profile)
    outcomes = []
    for i in range(1, 15):  # CoPaw's byte estimate undercounts: it compacts late (turn 12)
        services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                           *tool_turn(i, output_bytes=2_000)])
        _, trace = services.session_prepare(session=session)
        outcomes.append(trace["outcome"])
        assert trace["policy"] == "copaw"
    assert "compacted" in outcomes
    session.refresh_from_db()
    rows = list(SessionMessage.objects.filter(session=session))
    live_ids = set(stored_live_ids(session))
    assert {r.message_id for r in rows if r.status == "live"} == live_ids
    archived = [r for r in rows if r.status == "archived"]
    assert archived and all(r.archive_file and r.archive_line for r in archived)
    # CoPaw cuts tool output in the hook: recorded as an in-hook (stage 2) cut.
    assert any(r.truncated_stage == 2 for r in rows)
