"""What-if: a session replayed under a profile's edited knobs, beside what happened; nothing of it changes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, SessionMessage, Turn, WhatIfRun
from tests.dashboard.conftest import work


def _fingerprint(session: AgentSession) -> tuple[object, ...]:
    files = sorted((str(p.relative_to(session.workspace)), hashlib.sha256(p.read_bytes()).hexdigest())
                   for p in Path(session.workspace).rglob("*") if p.is_file())
    rows = list(SessionMessage.objects.filter(session=session).values_list("message_id", "status", "fate"))
    turns = list(Turn.objects.filter(session=session).values_list("number", "outcome", "payload_tokens"))
    session.refresh_from_db()
    return files, rows, turns, session.state_version, session.summary


def _run(profile, session, values, by) -> WhatIfRun:
    run = services.whatif_start(profile=profile, session=session, values=values, by=by)
    # Outside a test transaction the job starts at the commit; here it is run directly.
    services.whatif_execute(run.pk)
    run.refresh_from_db()
    return run


@pytest.fixture
def eight_turns(alice_session):
    work(alice_session, 8)
    return alice_session


def test_it_replays_the_same_turns_and_matches_what_happened_under_the_same_knobs(alice, eight_turns):
    profile = eight_turns.profile
    run = _run(profile, eight_turns, profile.recorded_values(), alice)
    assert run.status == WhatIfRun.Status.DONE, run.error
    result = run.result
    assert result["replayed"] == eight_turns.turns_count
    actual = {t.number: t.payload_tokens for t in eight_turns.turns.all()}
    # Same knobs, same compactor (extractive), same messages, same boundaries: the same run.
    assert [t["what_if"] for t in result["turns"]] == [actual[n] for n in sorted(actual)]
    assert result["what_if"]["compaction_turns"] == result["actual"]["compaction_turns"]


def test_it_shows_more_compactions_under_a_smaller_window_and_leaves_the_session_alone(alice, eight_turns):
    before = _fingerprint(eight_turns)
    values = {**eight_turns.profile.recorded_values(), "max_input_length": 2_500}
    run = _run(eight_turns.profile, eight_turns, values, alice)
    assert run.status == WhatIfRun.Status.DONE, run.error
    result = run.result
    assert result["what_if"]["compactions"] > result["actual"]["compactions"]
    assert result["window"] == {"actual": 4_000, "what_if": 2_500}
    for compaction in result["compactions"]["what_if"]:
        assert compaction["messages"] > 0
        assert compaction["lost_count"] >= len(compaction["lost"])
    assert _fingerprint(eight_turns) == before
    eight_turns.profile.refresh_from_db()
    assert eight_turns.profile.max_input_length == 4_000


def test_it_never_calls_the_model_of_an_llm_compactor(alice, eight_turns, settings):
    values = {**eight_turns.profile.recorded_values(), "compactor": "openai",
              "compaction_model": "summary-model", "max_input_length": 2_500}
    run = _run(eight_turns.profile, eight_turns, values, alice)
    assert run.status == WhatIfRun.Status.DONE, run.error
    assert "extractive compactor" in run.result["compactor_note"]
    assert run.result["what_if"]["compactions"] >= 1


def test_it_caps_the_turns_it_replays(alice, eight_turns, settings):
    settings.CONTEXTLAB_WHAT_IF_MAX_TURNS = 3
    run = _run(eight_turns.profile, eight_turns, eight_turns.profile.recorded_values(), alice)
    assert run.result["replayed"] == 3
    assert run.result["capped"] is True
    assert run.turns_total == 3


def test_it_refuses_another_owners_session(alice, bob, eight_turns):
    bobs = services.profile_create(owner=bob, name="bobs", knobs={})
    from contextlab.engine.core.errors import InvalidProfile

    with pytest.raises(InvalidProfile):
        services.whatif_start(profile=bobs, session=eight_turns, values=bobs.recorded_values(), by=bob)
