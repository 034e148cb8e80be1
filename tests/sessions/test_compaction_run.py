from __future__ import annotations

import json

import pytest

from contextlab.engine.core.errors import MalformedInput
from contextlab.sessions import services
from contextlab.sessions.models import CompactionRun, SessionMessage
from contextlab.sessions.services.persistence import stored_live_ids
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
    live = stored_live_ids(alice_session)
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


def _single_request(session, rounds: int) -> None:
    """One request, then the agent works through ``rounds`` tool rounds on it."""
    messages: list[dict] = [{"role": "user", "content": "Port every module under /srv/app to the new API."}]
    for i in range(rounds):
        call = f"call_{i}"
        messages += [
            {"role": "assistant", "content": f"Module m{i}.", "tool_calls": [{"id": call, "type": "function",
             "function": {"name": "run_shell", "arguments": json.dumps({"command": f"port m{i}"})}}]},
            {"role": "tool", "tool_call_id": call, "content": f"m{i}: 3 files changed"},
        ]
    services.messages_append(session=session, messages=messages)


def test_it_compacts_inside_a_single_long_request_by_hand(alice_session):
    _single_request(alice_session, 40)
    run = services.compaction_run(session=alice_session)
    assert run.status == CompactionRun.Status.DONE and run.outcome == "compacted" and not run.error
    alice_session.refresh_from_db()
    live = stored_live_ids(alice_session)
    request = SessionMessage.objects.get(session=alice_session, seq=1)
    assert live[0] == request.message_id and len(live) == 3  # the request, the newest call and its result
    assert alice_session.engine_state["pinned_ids"] == [request.message_id]
    assert_nothing_lost(alice_session)


def test_it_records_why_a_manual_compaction_had_nothing_to_do(alice_session):
    _single_request(alice_session, 1)
    run = services.compaction_run(session=alice_session)
    assert run.status == CompactionRun.Status.DONE and run.outcome == "nothing_to_compact"
    assert "newest request" in run.error and "tool group" in run.error
    turn = alice_session.turns.get(number=run.turn_number)
    check = next(s for s in turn.trace["steps"] if s["step"] == "context_check")
    assert check["details"]["nothing_to_compact"] == run.error
