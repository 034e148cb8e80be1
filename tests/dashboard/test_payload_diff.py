"""The LLM view's diff of two payloads."""

from __future__ import annotations

from contextlab.lib import payload_diff

SYSTEM = {"role": "system", "content": "You are careful."}
ASK = {"role": "user", "content": "build it"}
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{\"cmd\": \"make\"}"}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "line\n" * 50}
CUT = {"role": "tool", "tool_call_id": "c1", "content": "line\n" * 3 + "<<<TRUNCATED>>>"}
SUMMARY = {"role": "user", "name": "summary", "content": "## Goal\n- build it"}


def test_it_classifies_layers():
    assert [payload_diff.layer_of(m) for m in (SYSTEM, SUMMARY, ASK, CALL, RESULT)] == [
        "system", "summary", "messages", "messages", "tool_results"]


def test_it_marks_added_removed_changed_and_same():
    before = [SYSTEM, ASK, CALL, RESULT]
    after = [SYSTEM, SUMMARY, CALL, CUT, {"role": "user", "content": "next"}]
    rows = payload_diff.diff_payloads(before, after)
    statuses = [(r.status, r.layer) for r in rows]
    assert ("same", "system") in statuses
    assert ("removed", "messages") in statuses  # the old request went into the summary
    assert ("added", "summary") in statuses
    changed = [r for r in rows if r.status == "changed"]
    assert len(changed) == 1 and changed[0].previous == RESULT and changed[0].message == CUT
    assert payload_diff.counts(rows) == {"same": 2, "added": 2, "removed": 1, "changed": 1}
    # Every message of the new payload appears once, in order.
    assert [r.index for r in rows if r.status != "removed"] == [0, 1, 2, 3, 4]


def test_it_treats_a_first_payload_as_all_new():
    rows = payload_diff.diff_payloads([], [SYSTEM, ASK])
    assert [r.status for r in rows] == ["added", "added"]


def test_it_never_pairs_two_plain_messages():
    rows = payload_diff.diff_payloads([ASK], [{"role": "user", "content": "another"}])
    assert sorted(r.status for r in rows) == ["added", "removed"]


def test_it_reads_tool_calls_as_text():
    assert "→ sh({\"cmd\": \"make\"})" in payload_diff.message_text(CALL)
