"""Manual compaction as a review: pins, a dry run on the pool, accept / discard, cancel."""

from __future__ import annotations

import pytest

from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, CompactionRun, SessionMessage
from contextlab.support import jobs
from tests.conversations import answer, tool_turn
from tests.fakellm import FakeLLM, Gate, Reply
from tests.jobs.test_compaction_job import SUMMARY, _fill, _llm_profile, _use_profile

pytestmark = pytest.mark.django_db(transaction=True)


def _unchanged(session: AgentSession) -> tuple:
    session.refresh_from_db()
    return (session.state_version, session.turns_count, session.summary_version, session.summary,
            session.live_count, SessionMessage.objects.filter(session=session, status="archived").count())


def _dry_run(session: AgentSession, instruction: str | None = None) -> CompactionRun:
    run = services.dry_run_start(session=session, instruction=instruction)
    assert jobs.drain(30)
    run.refresh_from_db()
    return run


def test_a_dry_run_drafts_with_the_profiles_llm_and_commits_nothing(alice, alice_session, settings):
    _fill(alice_session)
    with FakeLLM([Reply(SUMMARY)]) as llm:
        _use_profile(alice_session, _llm_profile(alice, llm, settings))
        before = _unchanged(alice_session)
        run = _dry_run(alice_session, "keep every path")
        assert run.status == "draft", run.error
        assert len(llm.requests) == 1 and "keep every path" in llm.requests[0].user_text + llm.requests[0].system_text
    draft = run.draft["draft"]
    assert draft["summary"].startswith("## Goal") and draft["compact_ids"]
    assert draft["outcome"] == "compacted" and draft["summary_version"] == 1
    assert _unchanged(alice_session) == before
    assert run.state_version == before[0]


def test_accept_commits_exactly_the_draft_without_a_second_call(alice, alice_session, settings):
    _fill(alice_session)
    with FakeLLM([Reply(SUMMARY)]) as llm:
        _use_profile(alice_session, _llm_profile(alice, llm, settings))
        run = _dry_run(alice_session)
        services.draft_accept(run=run)
        assert len(llm.requests) == 1
    alice_session.refresh_from_db()
    assert run.status == "accepted" and run.turn_number == alice_session.turns_count
    assert alice_session.summary == run.draft["draft"]["summary"]
    assert alice_session.summary_version == 1
    turn = alice_session.turns.get(number=run.turn_number)
    assert turn.trigger == "manual" and turn.outcome == "compacted"


def test_accept_rebases_over_new_messages(alice_session):
    _fill(alice_session)
    run = _dry_run(alice_session)
    services.messages_append(session=alice_session, messages=[answer(3), *tool_turn(4)])
    services.draft_accept(run=run)
    alice_session.refresh_from_db()
    assert alice_session.summary == run.draft["draft"]["summary"]
    live = set(SessionMessage.objects.filter(session=alice_session, status="live").values_list("message_id",
                                                                                                flat=True))
    assert not live & set(run.draft["draft"]["compact_ids"])


def test_accept_refuses_a_stale_draft_and_commits_nothing(alice_session):
    _fill(alice_session)
    run = _dry_run(alice_session)
    services.compaction_run(session=alice_session)  # another compaction landed meanwhile
    before = _unchanged(alice_session)
    with pytest.raises(services.DraftStale):
        services.draft_accept(run=run)
    run.refresh_from_db()
    assert run.status == "stale" and "run a new dry run" in run.error
    assert _unchanged(alice_session) == before


def test_a_pin_changed_after_the_draft_makes_it_stale(alice_session):
    _fill(alice_session)
    run = _dry_run(alice_session)
    services.pin_fact(session=alice_session, fact="the DB is /srv/db.sqlite")
    with pytest.raises(services.DraftStale):
        services.draft_accept(run=run)


def test_discard_drops_the_draft_and_nothing_changes(alice_session):
    _fill(alice_session)
    before = _unchanged(alice_session)
    run = _dry_run(alice_session)
    services.draft_discard(run=run)
    assert run.status == "discarded"
    assert _unchanged(alice_session) == before
    with pytest.raises(services.DraftNotOpen):
        services.draft_accept(run=run)


@pytest.mark.parametrize("kind", ["dry_run", "compaction"])
def test_cancel_while_the_summary_is_written_throws_the_result_away(alice, alice_session, settings, kind):
    _fill(alice_session)
    gate = Gate(Reply(SUMMARY))
    with FakeLLM([gate]) as llm:
        _use_profile(alice_session, _llm_profile(alice, llm, settings))
        before = _unchanged(alice_session)
        start = services.dry_run_start if kind == "dry_run" else services.compaction_start
        run = start(session=alice_session)
        assert gate.arrived.wait(30), "the summary call started"
        services.run_cancel(run=run)
        gate.opened.set()
        assert jobs.drain(30)
    run.refresh_from_db()
    assert run.status == "cancelled" and run.draft is None and run.turn_number is None
    assert _unchanged(alice_session) == before
    alice_session.refresh_from_db()
    assert alice_session.summary_call_until is None


def test_pins_keep_a_message_live_and_a_fact_in_the_summary(alice_session):
    _fill(alice_session)
    first = SessionMessage.objects.filter(session=alice_session).order_by("seq").first()
    assert first is not None
    services.pin_message(session=alice_session, message_id=first.message_id)
    pins = services.pin_fact(session=alice_session, fact="must keep: the DB is /srv/db.sqlite")
    assert pins.message_ids == [first.message_id] and pins.facts == ["must keep: the DB is /srv/db.sqlite"]
    run = _dry_run(alice_session)
    assert first.message_id not in run.draft["draft"]["compact_ids"]
    assert "must keep: the DB is /srv/db.sqlite" in run.draft["draft"]["summary"]
    services.draft_accept(run=run)
    first.refresh_from_db()
    assert first.status == "live"
    turn = alice_session.turns.get(number=run.turn_number)
    check = next(s for s in turn.trace["steps"] if s["step"] == "context_check")
    assert check["details"]["pins"]["kept_live"] == [first.message_id]
    services.unpin_message(session=alice_session, message_id=first.message_id)
    assert services.pins_of(alice_session).message_ids == []
