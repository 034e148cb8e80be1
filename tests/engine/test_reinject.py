"""Re-injecting the original of a compacted or cut message: a new, counted message, recorded in fate and trace."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextlab.engine.core.errors import ContextLabError
from contextlab.engine.core.profile import Profile
from contextlab.engine.hook import ContextManager
from contextlab.engine.memory.reinject import SOURCE_KEY, reinject
from contextlab.engine.replay.whatif import TurnInput, replay_by_turn
from tests.engine.sessions import assistant, log_lines, tool_round, user

SMALL = Profile(max_input_length=4_000, recent_n=2, recent_max_bytes=1_500, old_max_bytes=400,
                markdown_recent_max_bytes=1_500, markdown_old_max_bytes=400)


def _cut_result(tmp_path) -> tuple[ContextManager, str, str]:
    m = ContextManager(SMALL, tmp_path / "ws", system_prompt="You build things.")
    full = log_lines(200, "needle")
    m.append([user("build"), *tool_round("bash", {"command": "make"}, [full]), assistant("done")])
    m.prepare()
    return m, m.messages[2].id, full


def test_it_puts_the_full_original_into_the_next_payload_and_counts_it(tmp_path) -> None:
    m, source_id, full = _cut_result(tmp_path)
    cut = m.messages[2]
    assert full not in cut.tool_results[0].output_text()
    before = m.live_exact_tokens
    added = reinject(m, m.original(cut), label="message #3")
    assert added.role == "user" and added.metadata[SOURCE_KEY] == source_id
    assert m.live_exact_tokens > before
    turn = m.prepare()
    sent = "\n".join(msg.plain_text() for msg in turn.payload)
    assert full.strip() in sent and "Re-injected: the original text of message #3" in sent
    assert turn.trace.payload["reinjected"] == [{"message_id": added.id, "source_id": source_id}]
    assert {"event": "reinjected", "before_turn": turn.trace.turn, "message_id": added.id} in m.fate[source_id]
    assert m.fate[added.id][0][SOURCE_KEY] == source_id
    # Only the turn right after it lists it.
    assert "reinjected" not in m.prepare().trace.payload


def test_a_reinjected_message_is_compacted_later_like_any_other(tmp_path) -> None:
    m, source_id, _ = _cut_result(tmp_path)
    added = reinject(m, m.original(m.messages[2]))
    for i in range(12):
        m.append([user(f"step {i}"), *tool_round("bash", {"command": f"s{i}"}, [log_lines(40, f"s{i}")]),
                  assistant(f"ok {i}")])
        m.prepare()
    assert added.id in m.archived_ids


def test_it_refuses_an_original_over_the_message_limit_and_changes_nothing(tmp_path) -> None:
    m, _, _ = _cut_result(tmp_path)
    small = ContextManager(Profile(max_input_length=4_000, max_message_bytes=1_024), tmp_path / "small")
    small.append([user("hi")])
    ids = small.live_ids()
    with pytest.raises(ContextLabError):
        reinject(small, m.original(m.messages[2]))
    assert small.live_ids() == ids


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=8), min_size=1, max_size=8))
def test_a_replay_by_turn_runs_one_turn_per_input_whatever_the_grouping(tmp_path_factory, sizes) -> None:
    m = ContextManager(SMALL, tmp_path_factory.mktemp("ws"), system_prompt="s", memory_workspace=False)
    inputs = [TurnInput("auto", [user(f"u{i}"), *tool_round("bash", {"c": i}, [log_lines(n * 10, f"x{i}")])])
              for i, n in enumerate(sizes)]
    turns = list(replay_by_turn(inputs, m))
    assert [t.number for t in turns] == list(range(1, len(sizes) + 1))
    for t in turns:
        # Every compaction names what it compacted; no payload is over the window.
        assert not t.did_compact or t.compacted
        assert not t.over_window
