"""A turn's payload is stored as a delta against the previous turn's, and always read whole."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextlab.sessions import payload_delta, services
from contextlab.sessions.models import Turn
from contextlab.sessions.services import persistence
from tests.conversations import answer, tool_turn

# Committed transactions: the engine (and its last payload) goes back into the cache only on commit.
pytestmark = pytest.mark.django_db(transaction=True)


def _stored(turn: Turn) -> Any:
    return turn.__dict__["payload"]


def _turns(session: Any, count: int, *, first: int = 1, output_bytes: int = 300) -> list[list[dict[str, Any]]]:
    payloads = []
    for i in range(first, first + count):
        services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                            *tool_turn(i, output_bytes=output_bytes)])
        payload, _ = services.session_prepare(session=session)
        payloads.append(payload)
    return payloads


def test_it_stores_later_turns_as_deltas_and_reads_every_payload_whole(alice_session):
    payloads = _turns(alice_session, 6)
    rows = list(Turn.objects.filter(session=alice_session).order_by("number"))
    assert isinstance(_stored(rows[0]), list)
    assert all(payload_delta.is_delta(_stored(row)) for row in rows[1:])
    # A delta carries the new messages only, not the whole live context again.
    carried = [op for op in _stored(rows[-1])["ops"] if isinstance(op, dict)]
    assert len(carried) < len(payloads[-1])
    assert [row.payload for row in rows] == payloads
    assert [Turn.objects.get(pk=row.pk).payload for row in rows] == payloads
    # Deferred, then read: still whole.
    assert Turn.objects.defer("payload").get(pk=rows[-1].pk).payload == payloads[-1]


def test_it_stores_the_payload_whole_after_a_cold_load(alice_session):
    _turns(alice_session, 2)
    persistence.engines.clear()  # another process wrote last: no previous payload in memory
    payloads = _turns(alice_session, 2, first=3)
    third, fourth = Turn.objects.filter(session=alice_session, number__in=[3, 4]).order_by("number")
    assert isinstance(_stored(third), list)
    assert payload_delta.is_delta(_stored(fourth))
    assert [third.payload, fourth.payload] == payloads


def test_it_stores_a_whole_payload_again_every_keyframe_interval(alice_session):
    count = payload_delta.KEYFRAME_EVERY + 3
    payloads = _turns(alice_session, count, output_bytes=50)
    rows = list(Turn.objects.filter(session=alice_session).order_by("number"))
    whole = [row.number for row in rows if isinstance(_stored(row), list)]
    assert whole == [1, payload_delta.KEYFRAME_EVERY + 2]
    assert all(_stored(row)["keyframe"] == 1 for row in rows[1:payload_delta.KEYFRAME_EVERY + 1])
    assert [Turn.objects.get(pk=row.pk).payload for row in rows] == payloads


def test_it_shows_no_payload_rather_than_failing_when_a_base_row_is_gone(alice_session):
    _turns(alice_session, 3)
    Turn.objects.filter(session=alice_session, number=2).delete()
    assert Turn.objects.get(session=alice_session, number=3).payload == []


_messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"]),
                                            "content": st.sampled_from(["a", "b", "c", "d", ""])}), max_size=12)


@given(base=_messages, payload=_messages)
def test_it_rebuilds_any_payload_from_any_base(base, payload):
    ops, carried = payload_delta.operations(base, payload)
    assert payload_delta.apply(base, ops) == payload
    assert carried == sum(isinstance(op, dict) for op in ops)
    stored = payload_delta.encode(1, 1, ops)
    assert payload_delta.rebuild(2, stored, {1: base}) == payload


def test_it_keeps_a_shared_prefix_and_an_appended_tail_as_one_range_and_the_new_messages():
    base = [{"role": "system", "content": "s"}, *({"role": "user", "content": str(i)} for i in range(100))]
    payload = [*base[:1], *base[3:], {"role": "user", "content": "new"}]
    ops, carried = payload_delta.operations(base, payload)
    assert ops == [[0, 1], [3, 101], {"role": "user", "content": "new"}]
    assert carried == 1


def test_it_exports_and_imports_deltas_that_still_rebuild(alice_session, alice):
    payloads = _turns(alice_session, 4)
    bundle = services.session_export(session=alice_session)
    copy = services.session_import_bundle(owner=alice, data=bundle)
    rows = list(Turn.objects.filter(session=copy).order_by("number"))
    assert any(payload_delta.is_delta(_stored(row)) for row in rows)
    assert [row.payload for row in rows] == payloads
