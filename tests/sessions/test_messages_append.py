from __future__ import annotations

import hashlib

import pytest

from contextlab.engine.core.errors import InvalidMessages, MalformedInput
from contextlab.sessions import services
from contextlab.sessions.models import OffloadedFile, SessionMessage
from contextlab.sessions.services.persistence import stored_live_ids
from tests.conversations import log_output, tool_turn


def test_it_appends_openai_messages(alice_session):
    rows = services.messages_append(session=alice_session, messages=tool_turn(1))
    assert [r.role for r in rows] == ["user", "assistant", "tool"]
    assert [r.seq for r in rows] == [1, 2, 3]
    assert all(r.status == "live" and r.tokens > 0 for r in rows)
    alice_session.refresh_from_db()
    assert alice_session.messages_count == 3
    assert alice_session.live_count == 3
    assert len(stored_live_ids(alice_session)) == 3


def test_it_detects_anthropic_messages(alice_session):
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "List the files"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py\nb.py"}]},
    ]
    rows = services.messages_append(session=alice_session, messages=messages)
    assert [r.role for r in rows][:2] == ["user", "assistant"]
    assert rows[-1].content[0]["type"] == "tool_result"


def test_it_detects_agentscope_messages(alice_session):
    messages = [
        {"id": "m1", "name": "user", "role": "user", "content": [{"type": "text", "text": "hello"}],
         "metadata": {}, "timestamp": "2026-03-20 10:00:00.000"},
        {"id": "m2", "name": "Friday", "role": "assistant", "content": [{"type": "text", "text": "hi"}],
         "metadata": {}, "timestamp": "2026-03-20 10:00:01.000"},
    ]
    rows = services.messages_append(session=alice_session, messages=messages)
    assert [r.message_id for r in rows] == ["m1", "m2"]


def test_it_accepts_a_tool_result_answering_an_earlier_batch(alice_session):
    first, second = tool_turn(1)[:2], tool_turn(1)[2:]
    services.messages_append(session=alice_session, messages=first)
    rows = services.messages_append(session=alice_session, messages=second)
    assert rows[0].role == "tool"


def test_it_truncates_large_tool_results_at_stage_one_and_records_the_file(alice_session):
    output = log_output(5_000, tag="t1")
    rows = services.messages_append(session=alice_session, messages=tool_turn(1, output_bytes=5_000))
    tool = rows[-1]
    assert tool.truncated_stage == 1
    assert tool.truncated_turn == 1
    assert tool.content[0]["output"] == output  # the row keeps what was ingested
    assert "<<<TRUNCATED>>>" in tool.current_content[0]["output"]
    offloaded = OffloadedFile.objects.get(session=alice_session)
    assert offloaded.message_id == tool.message_id
    assert offloaded.referenced
    saved = (alice_session.workspace / offloaded.path).read_bytes()
    assert saved == output.encode()
    assert offloaded.sha256 == hashlib.sha256(saved).hexdigest()


def test_it_leaves_the_session_untouched_when_a_batch_is_bad(alice_session):
    services.messages_append(session=alice_session, messages=tool_turn(1))
    alice_session.refresh_from_db()
    state = alice_session.engine_state
    bad = [*tool_turn(2)[:2], {"role": "tool", "tool_call_id": "nobody_called_me", "content": "x"}]
    with pytest.raises(InvalidMessages) as info:
        services.messages_append(session=alice_session, messages=bad)
    assert info.value.field == "messages[2].tool_call_id"
    alice_session.refresh_from_db()
    assert alice_session.engine_state == state
    assert SessionMessage.objects.filter(session=alice_session).count() == 3


def test_it_refuses_nul_characters(alice_session):
    with pytest.raises(InvalidMessages) as info:
        services.messages_append(session=alice_session, messages=[{"role": "user", "content": "a\x00b"}])
    assert info.value.field == "messages[0]"


def test_it_refuses_an_empty_batch(alice_session):
    with pytest.raises(InvalidMessages) as info:
        services.messages_append(session=alice_session, messages=[])
    assert info.value.field == "messages"


def test_it_refuses_a_message_over_the_profile_limit(alice, alice_session):
    profile = services.profile_create(owner=alice, name="tight", knobs={"max_message_bytes": 1_000})
    session = services.session_create(owner=alice, system_prompt="", profile=profile)
    with pytest.raises(MalformedInput) as info:
        services.messages_append(session=session, messages=[{"role": "user", "content": "x" * 2_000}])
    assert info.value.field == "messages[0].content"
