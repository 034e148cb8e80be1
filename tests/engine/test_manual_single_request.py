"""Manual compaction of a session that is one request followed by many tool rounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextlab.engine.core.messages import check_sequence
from contextlab.engine.core.profile import Profile
from contextlab.engine.hook import ContextManager
from tests.engine.sessions import log_lines, tool_round, user


@pytest.mark.parametrize("window", [64_000, 200_000, 400_000])
def test_it_splits_inside_the_newest_turn_at_tool_group_boundaries(tmp_path: Path, window: int) -> None:
    m = ContextManager(Profile(max_input_length=window), tmp_path / "ws")
    request = user("Migrate the whole code base to the new logging API.")
    rounds = [tool_round("bash", {"command": f"grep -rn log src/m{i}"}, [log_lines(8, f"m{i}")] * (1 + i % 2))
              for i in range(160)]
    m.append([request])
    for round_ in rounds:
        m.append(round_)
    preview = m.preview_compaction()
    result = m.compact("keep every module name")
    assert result.trace.outcome == "compacted"
    newest = rounds[-1]
    assert m.live_ids() == [request.id] + [msg.id for msg in newest]
    marked = result.trace.get("mark_compressed")
    assert marked is not None and preview.compact_ids == list(marked.details["locations"])
    assert preview.pinned_ids == [request.id]
    assert result.trace.payload["pinned_message_ids"] == [request.id]
    # Every earlier group left whole: no call without its results, no result without its call.
    archived = set(m.archived_ids)
    for round_ in rounds[:-1]:
        assert {msg.id for msg in round_} <= archived
    check_sequence(result.payload[1:])
    assert "## " in (m.summary or "")


def test_it_says_why_when_nothing_can_go(tmp_path: Path) -> None:
    m = ContextManager(Profile(max_input_length=64_000), tmp_path / "ws")
    m.append([user("Run the tests."), *tool_round("bash", {"command": "pytest"}, ["3 passed"])])
    result = m.compact()
    assert result.trace.outcome == "nothing_to_compact"
    check = result.trace.get("context_check")
    assert check is not None
    reason = check.details["nothing_to_compact"]
    assert "newest request" in reason and "tool group" in reason
    assert reason in check.reasons


def test_it_says_why_on_an_empty_session(tmp_path: Path) -> None:
    m = ContextManager(Profile(max_input_length=64_000), tmp_path / "ws")
    result = m.compact()
    assert result.trace.outcome == "nothing_to_compact"
    assert result.trace.get("context_check").details["nothing_to_compact"] == "there is no live message to compact"  # type: ignore[union-attr]
