"""Compactions far apart: deferred when they would free little, the kept part shrunk
instead of compacted again, and call arguments shortened (never lost) to hold the window."""

from __future__ import annotations

from pathlib import Path

from contextlab.engine.core.messages import Message, ToolResultBlock, ToolUseBlock
from contextlab.engine.core.profile import Profile
from contextlab.engine.hook import ContextManager
from contextlab.engine.policies.contextlab.policy import minimum_gain
from tests.engine.sessions import log_lines, tool_round, user

WINDOW = 8_000


def manager(tmp_path: Path) -> ContextManager:
    return ContextManager(Profile(max_input_length=WINDOW), tmp_path / "ws")


def test_it_defers_a_compaction_that_would_free_little_while_the_window_holds(tmp_path: Path) -> None:
    m = manager(tmp_path)
    # A long request the agent works on: pinned, so compaction cannot remove it.
    m.append([user("Please review this specification. " + "The service must stay available. " * 800)])
    outcomes: list[str] = []
    sent: list[int] = []
    for i in range(30):
        m.append(tool_round("bash", {"command": f"make step-{i}"}, [log_lines(12, f"step{i}")]))
        result = m.prepare()
        outcomes.append(result.trace.outcome)
        sent.append(result.trace.payload["tokens"]["total"])
        check = result.trace.get("context_check")
        assert check is not None
        if result.trace.outcome == "no_action" and check.numbers["total"] >= check.numbers["threshold_left"]:
            gate = result.trace.get("gate")
            assert gate is not None
            assert check.numbers["minimum_gain"] == minimum_gain(m.profile.threshold, m.profile.reserve,
                                                                 WINDOW, gate.numbers["used"])
            assert any("compaction deferred" in reason for reason in check.reasons)
    assert max(sent) <= WINDOW
    compactions = outcomes.count("compacted")
    deferred = sum(1 for r in m.traces if "compaction deferred" in (r.get("context_check").outcome or ""))  # type: ignore[union-attr]
    # Over the threshold from the first turns on, yet it compacts only when the window demands it.
    assert deferred >= 10
    assert 1 <= compactions <= 5, outcomes


def test_it_shortens_the_newest_calls_arguments_instead_of_compacting_around_them(tmp_path: Path) -> None:
    m = manager(tmp_path)
    m.append([user("write the report")])
    for i in range(4):
        m.append(tool_round("search", {"query": f"market {i}"}, [log_lines(60, f"hit{i}")]))
        m.prepare()
    report = "# Report\n" + "A finding about the delivery market, with numbers. " * 300  # ~3,000 tokens
    call = ToolUseBlock(id="call-report", name="write_file", input={"path": "report.md", "content": report})
    head = Message(role="assistant", content=(call,), id="a-report")
    done = Message(role="tool", content=(ToolResultBlock(id="call-report", name="write_file", output="written"),),
                   id="t-report")
    m.append([head, done])
    result = m.prepare()
    assert result.trace.payload["tokens"]["total"] <= WINDOW
    check = result.trace.get("context_check")
    assert check is not None
    assert {"message_id": "a-report", "what": "arguments"}.items() <= check.details["kept_part_shrunk"][0].items()
    live = next(msg for msg in m.messages if msg.id == "a-report")
    assert len(live.tool_uses[0].input["content"]) < len(report) // 5
    assert m.original(live).tool_uses[0].input == call.input
    assert any(e.get("reason") == "kept part over the reserve" for e in m.fate["a-report"])


def test_it_cuts_an_unread_result_that_alone_is_over_the_reserve(tmp_path: Path) -> None:
    # (An unread result under the reserve arrives whole: tests/gateway/test_compaction.py.)
    m = manager(tmp_path)
    m.append([user("build it")])
    big = log_lines(500)  # about 10,000 tokens: more than the window, less than the stage-1 limit
    round_ = tool_round("bash", {"command": "make all"}, [big])
    m.append(round_)
    result = m.prepare()
    assert result.trace.payload["tokens"]["total"] <= WINDOW
    assert any(e.get("reason") == "kept part over the reserve" for e in m.fate[round_[1].id])
    live = next(msg for msg in m.messages if msg.id == round_[1].id)
    original = m.original(live).content[0]
    assert isinstance(original, ToolResultBlock) and original.output == big


def test_it_shortens_huge_call_arguments_to_fit_the_window_and_keeps_them_whole(tmp_path: Path) -> None:
    m = manager(tmp_path)
    report = "# Report\n" + "A finding about the delivery market, with numbers. " * 1_500  # ~15,000 tokens
    call = ToolUseBlock(id="call-1", name="write_file", input={"path": "report.md", "content": report})
    head = Message(role="assistant", content=(call,), id="a-1")
    done = Message(role="tool", content=(ToolResultBlock(id="call-1", name="write_file", output="written"),),
                   id="t-1")
    m.append([user("write the report"), head, done])
    result = m.prepare()
    assert result.trace.payload["tokens"]["total"] <= WINDOW
    live = next(msg for msg in m.messages if msg.id == "a-1")
    short = live.tool_uses[0].input
    entry = live.metadata["offload_args"]["0"]
    assert short["path"] == "report.md" and entry["file"] in short["content"]
    assert m.original(live).tool_uses[0].input == call.input
    assert entry["file"] in m.referenced_files()


def test_it_lets_the_first_compaction_wait_until_the_payload_is_a_reserve_past_the_threshold(tmp_path: Path) -> None:
    m = manager(tmp_path)
    threshold, reserve = m.profile.threshold, m.profile.reserve
    m.append([user("build the project and fix what breaks")])
    before_first: int | None = None
    for i in range(200):
        m.append(tool_round("bash", {"command": f"make step-{i}"}, [log_lines(6, f"step{i}")]))
        result = m.prepare()
        sent = result.trace.payload["tokens"]["total"]
        assert sent <= WINDOW
        if result.trace.outcome == "compacted":
            gate, check = result.trace.get("gate"), result.trace.get("context_check")
            assert gate is not None and check is not None
            before_first = gate.numbers["used"] + check.numbers["total"]
            break
        # Past the threshold by less than a reserve, or further while CoPaw's own estimate would
        # not compact yet (the policy never compacts before CoPaw would): no compaction yet.
        check = result.trace.get("context_check")
        waits_for_copaw = check is not None and check.details.get("deferred_for") == "copaw_trigger"
        assert sent < threshold + reserve + 400 or waits_for_copaw, (i, sent)
    assert before_first is not None
    # It brought down a payload at least one reserve past the threshold, and at most one round
    # past the window (the round that would overflow it forces the compaction; what is sent fits).
    assert threshold + reserve - 400 <= before_first <= WINDOW + 400
    assert minimum_gain(threshold, reserve, WINDOW, 0) == threshold


def test_it_never_waits_past_two_reserves_below_the_window_nor_less_than_the_band() -> None:
    # A threshold at 75 %: one reserve past it would leave only 1.5 reserves of headroom, so 2 win.
    assert minimum_gain(7_500, 1_000, 10_000, 0) == 7_000
    # Defaults (70 %, 10 %), nothing fixed yet: the whole threshold, not just the band.
    assert minimum_gain(7_000, 1_000, 10_000, 0) == 7_000
    assert minimum_gain(7_000, 1_000, 10_000, 500) == 6_500
    # A large summary leaves little room: the band still holds.
    assert minimum_gain(5_600, 800, 8_000, 3_000) == 4_800
