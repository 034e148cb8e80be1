"""Pins before a compaction, and the dry run that drafts a compaction without committing it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextlab.engine.compactors.base import SummaryRequest, SummaryResult
from contextlab.engine.compactors.extractive import ExtractiveCompactor
from contextlab.engine.core.errors import MalformedInput
from contextlab.engine.core.messages import Message, check_sequence
from contextlab.engine.core.profile import Profile
from contextlab.engine.hook import ContextManager, TurnResult
from contextlab.engine.memory.pins import FACTS_LEAD, IDENTIFIERS_LEAD, MAX_PINNED_MESSAGES
from contextlab.engine.stages.summary.identifiers import extract_identifiers, normalize
from contextlab.engine.stages.summary.plan import StalePlan, planned_from_dict, planned_to_dict
from tests.engine.sessions import assistant, log_lines, tool_round, user
from tests.engine.test_window_bound import agent_sessions, payload_tokens

SMALL = Profile(max_input_length=4_000, recent_n=2, recent_max_bytes=1_500, old_max_bytes=400)


class RecordingCompactor(ExtractiveCompactor):
    """The extractive summary, remembering what it was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[SummaryRequest] = []

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.requests.append(request)
        return super().summarize(request)


def filled(workspace: Path, rounds: int = 6, compactor: ExtractiveCompactor | None = None,
           lines: int = 20) -> ContextManager:
    manager = ContextManager(SMALL, workspace, system_prompt="You are a build assistant.",
                             compactor=compactor or ExtractiveCompactor())
    for i in range(rounds):
        manager.append([user(f"step {i}: build target {i} from src/target_{i}.c"),
                        *tool_round("bash", {"command": f"make t{i}"}, [log_lines(lines, f"t{i}")]),
                        assistant(f"target {i} built")])
    return manager


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_it_keeps_a_pinned_message_live_and_records_the_pins_in_the_trace(tmp_path) -> None:
    manager = filled(tmp_path / "ws", lines=4)
    pinned = manager.messages[1].id  # the first tool call: its result stays with it
    manager.pin_message(pinned)
    result = manager.compact()
    assert result.trace.outcome == "compacted"
    live = manager.live_ids()
    assert pinned in live and manager.messages[2].id in live  # the call and its result
    check_sequence(manager.messages)
    pins = result.trace.get("context_check").details["pins"]
    assert pins["kept_live"] == [pinned] and pins["compacted"] == []


def test_it_puts_a_pinned_fact_in_the_instruction_and_the_summary(tmp_path) -> None:
    compactor = RecordingCompactor()
    manager = filled(tmp_path / "ws", compactor=compactor)
    manager.pin_fact("  the DB is   /srv/db.sqlite ")
    assert manager.pins.facts == ["the DB is /srv/db.sqlite"]
    manager.compact("keep the paths")
    asked = compactor.requests[-1].extra_instruction or ""
    assert asked.startswith("keep the paths") and "the DB is /srv/db.sqlite" in asked
    assert f"{FACTS_LEAD}: the DB is /srv/db.sqlite" in (manager.summary or "")


def test_it_compacts_a_pinned_message_over_the_budget_with_its_identifiers(tmp_path) -> None:
    profile = SMALL.replace(reserve_ratio=0.05)  # pin budget: 100 tokens
    manager = ContextManager(profile, tmp_path / "ws", compactor=ExtractiveCompactor())
    big = user("deploy with lib/deploy/rollout_plan.ex and scripts/zz_migrate.sh " + "please " * 300)
    manager.append([big, assistant("ok"), user("next step"), assistant("done"), user("and now?")])
    manager.pin_message(big.id)
    result = manager.compact()
    assert big.id in manager.archived_ids
    assert result.trace.get("context_check").details["pins"]["compacted"] == [big.id]
    summary = manager.summary or ""
    for identifier in extract_identifiers([big]):
        assert identifier.value in normalize(summary)
    assert IDENTIFIERS_LEAD in summary or "lib/deploy/rollout_plan.ex" in summary


def test_it_refuses_to_pin_a_message_that_is_not_live_or_an_empty_fact(tmp_path) -> None:
    manager = filled(tmp_path / "ws", rounds=2)
    with pytest.raises(MalformedInput):
        manager.pin_message("no-such-message")
    with pytest.raises(MalformedInput):
        manager.pin_fact("   ")


def test_the_pins_survive_a_state_round_trip_and_can_be_removed(tmp_path) -> None:
    manager = filled(tmp_path / "ws", rounds=2)
    manager.pin_message(manager.messages[0].id)
    manager.pin_fact("the DB is /srv/db.sqlite")
    back = ContextManager.from_state(SMALL, tmp_path / "ws", manager.export_state(per_message=False)
                                     | {"messages": [ContextManager.message_form(m) for m in manager.messages]})
    assert back.pins.to_dict() == manager.pins.to_dict()
    back.unpin_message(manager.messages[0].id)
    back.unpin_fact("the DB is /srv/db.sqlite")
    assert not back.pins


def test_a_dry_run_changes_nothing_and_its_draft_is_what_the_commit_stores(tmp_path) -> None:
    manager = filled(tmp_path / "ws")
    manager.pin_fact("the DB is /srv/db.sqlite")
    state = json.dumps(manager.export_state(), sort_keys=True)
    files = files_under(tmp_path / "ws")
    plan = manager.plan_compaction(manual=True)
    assert plan is not None
    planned = manager.summarize_plan(plan)
    draft = manager.draft_compaction(planned)
    assert draft.outcome == "compacted" and draft.summary and draft.compact_ids == plan.compact_ids
    assert draft.summary_version == manager.summary_version + 1
    assert json.dumps(manager.export_state(), sort_keys=True) == state
    assert files_under(tmp_path / "ws") == files
    # The draft travels as JSON (a later request accepts it) and commits exactly.
    stored = planned_from_dict(json.loads(json.dumps(planned_to_dict(planned))))
    manager.compact(plan.instruction, planned=stored)
    assert manager.summary == draft.summary


def test_an_accepted_draft_rebases_over_appends_and_refuses_a_moved_prefix(tmp_path) -> None:
    manager = filled(tmp_path / "ws")
    plan = manager.plan_compaction(manual=True)
    assert plan is not None
    planned = planned_from_dict(planned_to_dict(manager.summarize_plan(plan)))
    draft = manager.draft_compaction(planned)
    manager.append([assistant("one more thing"), user("and a new request")])
    assert manager.draft_compaction(planned).summary == draft.summary
    other = filled(tmp_path / "other")
    other_plan = other.plan_compaction(manual=True)
    assert other_plan is not None
    other.compact()  # another compaction landed: the prefix is gone
    with pytest.raises(StalePlan):
        other.compact(planned=other.summarize_plan(other_plan))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(messages=agent_sessions(), window=st.sampled_from([8_000, 12_000]), data=st.data())
def test_it_never_archives_a_pinned_message_without_its_identifiers_and_holds_the_window(
        tmp_path_factory: pytest.TempPathFactory, messages: list[Message], window: int, data: st.DataObject) -> None:
    manager = ContextManager(Profile(max_input_length=window), tmp_path_factory.mktemp("ws"))
    # A request naming more paths than the summary's identifier line holds, pinned from the start.
    paths = data.draw(st.integers(0, 150))
    brief = Message.text("user", "work on " + " ".join(f"lib/mod_{k}/file_{k}.ex" for k in range(paths)),
                         id="brief")
    messages = [brief, *messages]
    originals = {m.id: m for m in messages}
    pin_share = data.draw(st.sampled_from([0.2, 0.5, 1.0]))

    def check(result: TurnResult) -> None:
        assert payload_tokens(result, []) <= window
        check_sequence(result.payload[1:] if result.summary_message else result.payload)
        for version in manager.summaries:
            text = normalize(version.text)
            for mid in version.compacted_ids:
                if mid in pinned_at.get(version.version, set()):
                    for identifier in extract_identifiers([originals[mid]]):
                        assert identifier.value in text, (mid, identifier)

    pinned_at: dict[int, set[str]] = {}
    pending: list[Message] = []
    for msg in messages:
        if msg.role == "assistant" and (pending or manager.messages):
            manager.append(pending)
            pending = []
            if "brief" in manager.live_ids() and "brief" not in manager.pins.message_ids:
                manager.pin_message("brief")
            # Pin a share of the live messages before the turn, as a person would.
            for live in manager.messages:
                if (live.id not in manager.pins.message_ids and len(manager.pins.message_ids) < MAX_PINNED_MESSAGES
                        and data.draw(st.floats(0, 1)) < pin_share / 4):
                    manager.pin_message(live.id)
            pinned_at[manager.summary_version + 1] = set(manager.pins.message_ids)
            manual = data.draw(st.integers(0, 5)) == 0
            check(manager.compact() if manual else manager.prepare())
        pending.append(msg)
