"""Fixtures of the dashboard tests: logged-in clients and sessions with history."""

from __future__ import annotations

import pytest
from django.test import Client

from contextlab.sessions import services
from tests.conversations import answer, tool_turn


@pytest.fixture
def alice_client(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def bob_client(bob) -> Client:
    client = Client()
    client.force_login(bob)
    return client


def work(session, turns: int, *, first: int = 1, output_bytes: int = 1_500) -> None:
    """``turns`` tool exchanges, each followed by a hook run, like an agent would."""
    for i in range(first, first + turns):
        services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                            *tool_turn(i, output_bytes=output_bytes)])
        services.session_prepare(session=session)
    session.refresh_from_db()


def defer_a_turn(session):
    """Short user turns on a worked session until the hook holds a compaction back (it would free too little)."""
    for i in range(60):
        services.messages_append(session=session, messages=[
            {"role": "user", "content": f"Short question {i}: is the build green on ci-node-{i}? " * 3}])
        services.session_prepare(session=session)
        turn = session.turns.order_by("-number").first()
        if any("deferred:" in step.get("outcome", "") for step in turn.trace["steps"]):
            session.refresh_from_db()
            return turn
    raise AssertionError(f"no deferred turn; outcomes: {list(session.turns.values_list('outcome', flat=True))}")


# The turns of ``worked_session``: a test that goes on with the conversation starts at WORKED_TURNS + 1.
WORKED_TURNS = 20


@pytest.fixture
def worked_session(alice_session):
    """Twenty turns on the small profile: stage-1 and stage-2 cuts and two compactions (a
    compaction waits until it frees the band between the reserve and the threshold, until
    the payload is a reserve past the threshold (``policy_contextlab.minimum_gain``), and
    until CoPaw's own estimate would compact: outputs of 2,000 bytes get there twice)."""
    work(alice_session, WORKED_TURNS, output_bytes=2_000)
    assert alice_session.compactions_count >= 2
    return alice_session


@pytest.fixture
def compactable_session(worked_session):
    """A new request after the last compaction: what came before it can be compacted by hand."""
    services.messages_append(session=worked_session,
                             messages=[answer(WORKED_TURNS), *tool_turn(WORKED_TURNS + 1, output_bytes=300)])
    worked_session.refresh_from_db()
    return worked_session
