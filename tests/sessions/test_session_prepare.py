from __future__ import annotations

from contextlab.sessions import services
from contextlab.sessions.models import SessionMessage, SummaryVersion, Turn
from contextlab.sessions.services import persistence
from tests.conversations import answer, tool_turn
from tests.invariants import assert_nothing_lost


def test_it_returns_the_payload_and_persists_the_turn(alice_session):
    services.messages_append(session=alice_session, messages=tool_turn(1))
    payload, trace = services.session_prepare(session=alice_session)
    assert payload[0] == {"role": "system", "content": "You are a careful coding agent."}
    assert [m["role"] for m in payload[1:]] == ["user", "assistant", "tool"]
    assert trace["turn"] == 1
    assert trace["outcome"] == "no_action"
    turn = Turn.objects.get(session=alice_session, number=1)
    assert turn.payload == payload
    assert turn.payload_tokens == trace["payload"]["tokens"]["total"]
    assert turn.threshold == 2_800
    assert turn.used_tokens > 0
    alice_session.refresh_from_db()
    assert alice_session.turns_count == 1
    assert alice_session.tokens_used == turn.payload_tokens
    assert alice_session.tokens_window == 4_000


def test_it_compacts_when_the_window_fills_and_loses_nothing(alice_session):
    outcomes = []
    # Outputs large enough that CoPaw's own estimate, which the policy waits for, fires too.
    for i in range(1, 13):
        services.messages_append(session=alice_session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                 *tool_turn(i, output_bytes=2_000)])
        _, trace = services.session_prepare(session=alice_session)
        outcomes.append(trace["outcome"])
        assert_nothing_lost(alice_session)
    assert "compacted" in outcomes
    alice_session.refresh_from_db()
    assert alice_session.compactions_count == outcomes.count("compacted")
    assert alice_session.summary_version >= 1
    assert alice_session.summary.startswith("## Goal") or "## Goal" in alice_session.summary
    versions = list(SummaryVersion.objects.filter(session=alice_session).values_list("version", flat=True))
    assert versions == list(range(1, alice_session.summary_version + 1))
    archived = SessionMessage.objects.filter(session=alice_session, status="archived")
    assert archived.exists()
    first = archived.first()
    assert first.compacted_turn is not None
    assert first.summary_version is not None
    assert first.archive_file.startswith("dialog/")
    assert "compacted in turn" in first.fate_text()


def test_it_recuts_results_that_slide_out_of_the_recent_window(alice_session):
    for i in range(1, 5):
        services.messages_append(session=alice_session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                 *tool_turn(i, output_bytes=1_000)])
        services.session_prepare(session=alice_session)
    first_result = SessionMessage.objects.get(session=alice_session, seq=3)
    assert first_result.truncated_stage == 2
    assert first_result.truncated_turn is not None


def test_it_persists_the_same_step_twice_without_duplicates(alice_session):
    # Persisting is keyed by message id and turn number, so replaying a
    # persist (a retried job) updates rows rather than adding them.
    services.messages_append(session=alice_session, messages=tool_turn(1))
    services.session_prepare(session=alice_session)
    alice_session.refresh_from_db()
    manager = persistence.load_manager(alice_session)
    before = dict.fromkeys(manager.fate, 0)
    originals = {}
    persistence.persist_step(alice_session, manager, before=before, originals=originals)
    assert SessionMessage.objects.filter(session=alice_session).count() == 3
    assert Turn.objects.filter(session=alice_session).count() == 1


def test_it_sends_the_same_payload_for_the_same_conversation_in_two_sessions(alice, small_profile):
    # The notices of cut outputs name their file after the call and its text,
    # not after the message ids the server generates: two sessions fed the same
    # conversation cost the same tokens, turn by turn, and compact alike.
    first, second = (services.session_create(owner=alice, system_prompt="You are a careful coding agent.",
                                             profile=small_profile, title=title) for title in ("one", "two"))
    for session in (first, second):
        for i in range(1, 13):
            services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                *tool_turn(i, output_bytes=1_500)])
            services.session_prepare(session=session)

    def history(session):
        return [(t.number, t.outcome, t.payload_tokens) for t in Turn.objects.filter(session=session)]

    assert history(first) == history(second)
    assert Turn.objects.get(session=first, number=12).payload == Turn.objects.get(session=second, number=12).payload
