from __future__ import annotations

import pytest

from contextlab.engine.errors import MalformedInput
from contextlab.sessions import services
from contextlab.sessions.models import CompactionRun, SessionMessage
from tests.conversations import answer, tool_turn
from tests.invariants import assert_nothing_lost


def _fill(session, turns: int) -> None:
    for i in range(1, turns + 1):
        services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []), *tool_turn(i)])


def test_it_previews_the_split_without_changing_anything(alice_session):
    _fill(alice_session, 3)
    alice_session.refresh_from_db()
    state = alice_session.engine_state
    preview = services.compaction_preview(session=alice_session)
    assert preview["compact_ids"]
    assert preview["keep_ids"]
    live = state["live_ids"]
    assert preview["compact_ids"] + preview["keep_ids"] == live
    alice_session.refresh_from_db()
    assert alice_session.engine_state == state


def test_it_runs_a_manual_compaction_and_records_the_run(alice, alice_session):
    _fill(alice_session, 3)
    run = services.compaction_run(session=alice_session, instruction="Keep every file path.", requested_by=alice)
    run.refresh_from_db()
    assert run.status == CompactionRun.Status.DONE
    assert run.outcome == "compacted"
    assert run.started is not None and run.finished is not None
    turn = alice_session.turns.get(number=run.turn_number)
    assert turn.trigger == "manual"
    summary_step = next(s for s in turn.trace["steps"] if s["step"] == "summary")
    assert summary_step["inputs"]["instruction"] == "Keep every file path."
    alice_session.refresh_from_db()
    assert alice_session.summary_version == 1
    assert alice_session.compactions_count == 1
    assert SessionMessage.objects.filter(session=alice_session, status="archived").exists()
    assert_nothing_lost(alice_session)


def test_it_records_nothing_to_compact_on_an_empty_session(alice_session):
    run = services.compaction_run(session=alice_session)
    assert run.status == CompactionRun.Status.DONE
    assert run.outcome == "nothing_to_compact"


def test_it_refuses_a_non_string_instruction(alice_session):
    with pytest.raises(MalformedInput) as info:
        services.compaction_run(session=alice_session, instruction=["not", "text"])  # type: ignore[arg-type]
    assert info.value.field == "instruction"
    assert not CompactionRun.objects.exists()
