"""Structured eviction: units, scoring, strategies, dependencies, limits, no loss."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextlab.engine.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock, check_sequence
from contextlab.engine.core.profile import Profile
from contextlab.engine.core.tokens import TiktokenCounter
from contextlab.engine.policies.eviction import (
    EvictionPlan,
    ExternalStore,
    InformationUnit,
    LayerQuotas,
    ScoreWeights,
    apply_plan,
    build_units,
    plan_eviction,
    score_units,
)
from contextlab.engine.replay.compare import compare_policies, render
from contextlab.engine.stages.archive import DialogArchive
from tests.corpus import corpus_path
from tests.engine.sessions import assistant, log_lines, tool_round, user

COUNTER = TiktokenCounter()
STRATEGIES = ("lowest_score_first", "sliding_window", "hierarchical_quota")


def units_of(messages: list[Message]) -> list[InformationUnit]:
    return build_units(messages, [COUNTER.count_message(m) for m in messages])


def total(messages: list[Message]) -> int:
    return sum(COUNTER.count_message(m) for m in messages)


def by_id(plan: EvictionPlan) -> dict[str, str]:
    return {a.unit_id: a.action for a in plan.actions}


def debugging_session(log_size: int = 1500) -> tuple[list[Message], dict[str, str]]:
    """An agent fixing a login test: an old large build log, some exploration,
    then a small, recent pytest failure about the thing the user asked for."""
    build = tool_round("bash", {"command": "make build"}, [log_lines(log_size)], text="Let me build the project first.")
    ls = tool_round("bash", {"command": "ls src"}, ["app.py\nmodels.py\nviews.py\n"])
    readme = tool_round("read_file", {"path": "README.md"}, ["# Demo\n" + "Some prose about the demo project.\n" * 40])
    failure = ("FAILED tests/test_api.py::test_login - AssertionError: expected status 200, got 500\n"
               "E   assert 500 == 200\n1 failed, 12 passed in 0.41s\n")
    pytest_round = tool_round("bash", {"command": "pytest tests/test_api.py -q"}, [failure])
    ask = user("The login test in tests/test_api.py fails with status 500; please fix test_login.")
    messages = [
        user("Set up the demo project."), *build, *ls, *readme, assistant("The project builds."),
        ask, *pytest_round,
        *tool_round("read_file", {"path": "src/views.py"}, ["def login(request):\n    return Response(500)\n"]),
    ]
    names = {"build_log": build[1].id, "pytest_result": pytest_round[1].id, "ask": ask.id,
             "readme": readme[1].id, "build_call": build[0].id}
    return messages, names


# -- units and scoring -----------------------------------------------------------------------------


def test_it_builds_one_unit_per_call_and_result_with_parents() -> None:
    head, first, second = tool_round("bash", {"command": "ls"}, ["a\n", "b\n"], text="Two listings.")
    messages = [user("list things"), head, first, second]
    units = units_of(messages)
    ids = [u.id for u in units]
    assert ids == [messages[0].id, f"{head.id}#0", f"{head.id}#1", f"{head.id}#2", first.id, second.id]
    kinds = {u.id: u.type for u in units}
    assert kinds[f"{head.id}#0"] == "assistant_text" and kinds[f"{head.id}#1"] == "tool_call"
    results = [u for u in units if u.type == "tool_result"]
    assert [r.parent for r in results] == [f"{head.id}#1", f"{head.id}#2"]
    assert len({u.group for u in units if u.group}) == 1  # one round
    # The message's tokens are shared among its units, exactly.
    assert sum(u.tokens for u in units if u.message_id == head.id) == COUNTER.count_message(head)


def test_it_scores_a_recent_relevant_small_result_above_an_old_large_log() -> None:
    messages, names = debugging_session()
    scored = {u.id: u for u in score_units(units_of(messages))}
    log, recent = scored[names["build_log"]], scored[names["pytest_result"]]
    assert recent.score > log.score
    assert recent.relevance > log.relevance
    assert recent.recency > log.recency
    assert log.density < 0.2 < recent.density
    assert set(recent.score_parts) >= {"relevance", "recency", "density"}


def test_it_marks_system_notes_the_newest_request_and_the_current_round_as_core() -> None:
    messages, names = debugging_session()
    messages = [Message.text("system", "You are a coding agent.", id="sys"), *messages]
    scored = {u.id: u for u in score_units(units_of(messages))}
    assert scored["sys"].core and scored["sys"].core_reason == "core: system note"
    assert scored[names["ask"]].core_reason == "core: newest user request"
    last_round = [u for u in scored.values() if u.position >= len(messages) - 2]
    assert last_round and all(u.core for u in last_round)
    assert not scored[names["build_log"]].core


def test_it_ranks_by_weights() -> None:
    messages, names = debugging_session()
    units = units_of(messages)
    only_density = {u.id: u for u in score_units(units, weights=ScoreWeights(0, 0, 1))}
    assert only_density[names["build_log"]].score == pytest.approx(only_density[names["build_log"]].density)
    with pytest.raises(ValueError):
        score_units(units, weights=ScoreWeights(0, 0, 0))


# -- strategies --------------------------------------------------------------------------------------


def test_it_evicts_the_old_low_density_log_first_with_lowest_score_first() -> None:
    messages, names = debugging_session()
    before = total(messages)
    plan = plan_eviction(units_of(messages), strategy="lowest_score_first", soft_limit=before - 1,
                         hard_limit=before, target=before - 500)
    actions = by_id(plan)
    assert actions[names["build_log"]] == "externalize"
    assert actions[names["pytest_result"]] == "keep"
    log_action = next(a for a in plan.actions if a.unit_id == names["build_log"])
    assert log_action.mode == "in_place"  # its call stays, so the result is replaced inside its message
    assert "cut-off" in log_action.reason and "low density" in log_action.reason
    assert plan.tokens_after_estimate <= before - 500
    assert plan.cutoff is not None


def test_it_evicts_the_oldest_rounds_whole_with_sliding_window() -> None:
    messages, names = debugging_session()
    before = total(messages)
    plan = plan_eviction(units_of(messages), strategy="sliding_window", soft_limit=before - 1,
                         hard_limit=before, target=before // 2)
    actions = {a.unit_id: a for a in plan.actions}
    # The oldest round leaves whole, call and result together, whatever its score.
    assert actions[names["build_log"]].mode == "round"
    assert actions[f"{names['build_call']}#1"].action == actions[names["build_log"]].action != "keep"
    assert "sliding window" in actions[names["build_log"]].reason
    # Evicted positions all come before every kept non-core position.
    evicted = [a for a in plan.actions if a.action != "keep"]
    kept = [u for u in score_units(units_of(messages)) if by_id(plan)[u.id] == "keep" and not u.core]
    assert max(u.position for u in units_of(messages) if u.id in {a.unit_id for a in evicted}) < min(
        (u.position for u in kept), default=10**9)


def test_it_prefers_summaries_and_bounds_the_summary_layer_with_hierarchical_quota() -> None:
    old_summaries = [Message.text("user", "[summary of earlier work] " + f"we explored module_{i}.c and fixed it. " * 30,
                                  id=f"sum{i}", name="summary") for i in range(4)]
    messages, names = debugging_session(log_size=300)
    messages = [messages[0], *old_summaries, *messages[1:]]
    before = total(messages)
    target = before // 2
    assert total(old_summaries) > 0.2 * target  # the summary layer starts over its quota
    plan = plan_eviction(units_of(messages), strategy="hierarchical_quota", soft_limit=before - 1,
                         hard_limit=before, target=target, quotas=LayerQuotas(core=0.2, working=0.6, summary=0.2))
    actions = {a.unit_id: a for a in plan.actions}
    # Existing summaries were over their quota: shortened or dropped, oldest / lowest first.
    assert any(actions[f"sum{i}"].action != "keep" for i in range(4))
    assert all("summary layer" in actions[f"sum{i}"].reason for i in range(4) if actions[f"sum{i}"].action != "keep")
    # Working units are summarized rather than externalized.
    assert plan.counts()["externalize"] == 0
    assert plan.counts()["summarize"] > 0
    assert any("layers: core" in note for note in plan.notes)
    assert plan.tokens_after_estimate <= target


def test_it_leaves_everything_alone_under_the_soft_limit() -> None:
    messages, _ = debugging_session()
    before = total(messages)
    for strategy in STRATEGIES:
        plan = plan_eviction(units_of(messages), strategy=strategy, soft_limit=before, hard_limit=before + 10,
                             target=before // 2)
        assert not plan.evictions()
        assert plan.tokens_after_estimate == before
        assert all("soft limit" in a.reason or a.reason.startswith("core") for a in plan.actions)


def test_it_never_evicts_core_units() -> None:
    messages, names = debugging_session()
    for strategy in STRATEGIES:
        units = units_of(messages)
        plan = plan_eviction(units, strategy=strategy, soft_limit=100, hard_limit=50_000, target=50)
        core = {u.id for u in score_units(units) if u.core}
        assert core and all(a.action == "keep" for a in plan.actions if a.unit_id in core)
        assert by_id(plan)[names["ask"]] == "keep"


def test_it_meets_the_hard_limit_by_summarizing_a_huge_current_result_in_place() -> None:
    ask = user("Show me the whole build log.")
    head, result = tool_round("bash", {"command": "make V=1"}, [log_lines(3000)])
    messages = [user("hi"), assistant("hello"), ask, head, result]
    before = total(messages)
    hard = before // 4
    for strategy in STRATEGIES:
        plan = plan_eviction(units_of(messages), strategy=strategy, soft_limit=hard // 2, hard_limit=hard,
                             target=hard // 4)
        assert plan.fits_hard_limit and plan.tokens_after_estimate <= hard
        action = next(a for a in plan.actions if a.unit_id == result.id)
        assert action.action == "summarize" and action.mode == "in_place" and "hard limit" in action.reason
        assert by_id(plan)[ask.id] == "keep"


def test_it_says_so_when_the_core_cannot_fit_the_hard_limit() -> None:
    messages = [user("please read this: " + "word " * 3000)]
    plan = plan_eviction(units_of(messages), strategy="lowest_score_first", soft_limit=100, hard_limit=200, target=50)
    assert not plan.fits_hard_limit
    assert any("cannot meet the hard limit" in note for note in plan.notes)
    assert not plan.evictions()


def test_it_rejects_bad_limits_and_unknown_strategies() -> None:
    units = units_of([user("hi")])
    with pytest.raises(ValueError, match="target"):
        plan_eviction(units, strategy="sliding_window", soft_limit=100, hard_limit=50, target=10)
    with pytest.raises(ValueError, match="unknown eviction strategy"):
        plan_eviction(units, strategy="random", soft_limit=100, hard_limit=200, target=10)
    with pytest.raises(ValueError):
        LayerQuotas(core=0.5, working=0.5, summary=0.5)


def test_it_plans_deterministically() -> None:
    messages, _ = debugging_session()
    for strategy in STRATEGIES:
        plans = [plan_eviction(units_of(messages), strategy=strategy, soft_limit=1000, hard_limit=3000, target=800)
                 for _ in range(2)]
        assert plans[0].to_dict() == plans[1].to_dict()


# -- dependencies and applying ---------------------------------------------------------------------------


def assert_dependencies(plan: EvictionPlan, units: list[InformationUnit]) -> None:
    acts = {a.unit_id: a for a in plan.actions}
    for u in units:
        if u.type != "tool_result" or u.parent is None:
            continue
        call, result = acts[u.parent], acts[u.id]
        if call.action != "keep":
            # The call left: its result left with it, in the same round placeholder.
            assert call.mode == "round" and result.mode == "round" and result.action == call.action
        elif result.action != "keep":
            # The call stays: its result is replaced in place, never silently dropped.
            assert result.mode == "in_place" and result.action in ("summarize", "externalize")


def test_it_keeps_calls_and_results_together(tmp_path: Path) -> None:
    messages, _ = debugging_session()
    for strategy in STRATEGIES:
        units = units_of(messages)
        plan = plan_eviction(units, strategy=strategy, soft_limit=500, hard_limit=3000, target=300)
        assert_dependencies(plan, units)
        new, _ = apply_plan(messages, plan, store=ExternalStore(tmp_path / strategy))
        check_sequence(new, allow_pending_tail=False)


def test_it_turns_a_removed_round_into_one_assistant_message(tmp_path: Path) -> None:
    old = tool_round("bash", {"command": "ls -R"}, [log_lines(400, "file"), log_lines(300, "dir")], text="Listing.")
    messages = [user("explore"), *old, user("now something else entirely"), assistant("ok")]
    before = total(messages)
    plan = plan_eviction(units_of(messages), strategy="sliding_window", soft_limit=before - 1, hard_limit=before,
                         target=200)
    new, records = apply_plan(messages, plan, store=ExternalStore(tmp_path))
    assert [m.role for m in new] == ["user", "assistant", "user", "assistant"]
    placeholder = new[1]
    text = placeholder.plain_text()
    assert text.startswith("[externalized tool round") and "recall(" in text and "externalized/" in text
    assert not placeholder.tool_uses
    [record] = records
    assert record["mode"] == "round" and record["message_ids"] == [m.id for m in old]
    assert ExternalStore(tmp_path).get(record["key"]) == old


def test_it_externalizes_losslessly(tmp_path: Path) -> None:
    messages, names = debugging_session()
    store = ExternalStore(tmp_path)
    before = total(messages)
    plan = plan_eviction(units_of(messages), strategy="lowest_score_first", soft_limit=before - 1,
                         hard_limit=before, target=before - 500)
    new, records = apply_plan(messages, plan, store=store)
    record = next(r for r in records if names["build_log"] in r["unit_ids"])
    assert record["action"] == "externalize"
    original = next(m for m in messages if m.id == names["build_log"])
    restored = store.get(record["key"])
    assert restored == [original]
    assert [m.to_dict() for m in restored] == [original.to_dict()]
    replaced = next(m for m in new if m.id == names["build_log"])
    [block] = replaced.tool_results
    assert block.output_text().startswith("[externalized: tool_result of bash \"make build\"")
    assert f'recall("{record["key"]}")' in block.output_text()
    assert replaced.metadata["eviction"]["blocks"]["0"]["key"] == record["key"]
    hits = store.search("make build compiling")
    assert hits and hits[0].message_id == names["build_log"]


def test_it_refuses_keys_that_are_not_hex(tmp_path: Path) -> None:
    store = ExternalStore(tmp_path)
    with pytest.raises(KeyError):
        store.get("../../etc/passwd")
    with pytest.raises(KeyError):
        store.get("0123456789abcdef0123")


def test_it_rejects_a_plan_for_other_messages(tmp_path: Path) -> None:
    messages, _ = debugging_session()
    plan = plan_eviction(units_of(messages), strategy="sliding_window", soft_limit=500, hard_limit=5000, target=300)
    with pytest.raises(ValueError, match="not in the list"):
        apply_plan(messages[:3], plan, store=ExternalStore(tmp_path))


def test_it_returns_dropped_originals_in_the_records(tmp_path: Path) -> None:
    # Small messages: a placeholder would cost about as much, so they are dropped.
    chatter = [user("hi"), assistant("hello, how can I help? " * 6), user("thanks, that was useful " * 6),
               assistant("you're welcome, anything else? " * 6)]
    messages = [*chatter, user("now the real question: " + "details " * 400)]
    before = total(messages)
    plan = plan_eviction(units_of(messages), strategy="sliding_window", soft_limit=before - 1, hard_limit=before,
                         target=before - 20)
    new, records = apply_plan(messages, plan, store=ExternalStore(tmp_path))
    drops = [r for r in records if r["action"] == "drop"]
    assert drops and all(r["originals"] and r["key"] is None for r in drops)
    gone = {m.id for m in messages} - {m.id for m in new}
    assert gone == {mid for r in drops for mid in r["message_ids"]}

    # With a dialog archive, dropped originals are also appended there.
    archive = DialogArchive(tmp_path)
    _, archived = apply_plan(messages, plan, store=ExternalStore(tmp_path), archive=archive)
    lines = {record["id"]: record for _, record in archive.iter_records()}
    for record in (r for r in archived if r["action"] == "drop"):
        assert record["archive"] and all(lines[mid]["evicted"] == "drop" for mid in record["message_ids"])
    assert set(lines) == gone


# -- hypothesis: validity and no loss --------------------------------------------------------------------


@st.composite
def sessions(draw: st.DrawFn) -> list[Message]:
    messages: list[Message] = []
    n = 0

    def next_id(prefix: str) -> str:
        nonlocal n
        n += 1
        return f"{prefix}{n}"

    for _ in range(draw(st.integers(1, 7))):
        messages.append(Message.text("user", draw(st.sampled_from(["fix the bug", "run tests", "请继续"])) + " "
                                     + "x " * draw(st.integers(0, 300)), id=next_id("u")))
        for _ in range(draw(st.integers(0, 4))):
            calls = draw(st.integers(0, 3))
            text = "thinking " * draw(st.integers(0, 50))
            if calls == 0:
                messages.append(Message.text("assistant", text or "ok", id=next_id("a")))
                continue
            uses = [ToolUseBlock(id=next_id("c"), name=draw(st.sampled_from(["bash", "read_file"])),
                                 input={"command": f"cmd {i}"}) for i in range(calls)]
            head = Message(role="assistant", content=((TextBlock(text),) if text else ()) + tuple(uses),
                           id=next_id("a"))
            messages.append(head)
            outputs = [log_lines(draw(st.integers(0, 200))) or "done" for _ in uses]
            if draw(st.booleans()):  # Anthropic style: all results in one user message
                messages.append(Message(role="user", content=tuple(
                    ToolResultBlock(id=u.id, name=u.name, output=o, is_error=draw(st.booleans()))
                    for u, o in zip(uses, outputs, strict=True)), id=next_id("r")))
            else:
                messages.extend(Message(role="tool", content=(ToolResultBlock(id=u.id, name=u.name, output=o),),
                                        id=next_id("t")) for u, o in zip(uses, outputs, strict=True))
    return messages


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(messages=sessions(), strategy=st.sampled_from(STRATEGIES), soft_share=st.floats(0.05, 1.2),
       rounds=st.integers(1, 3))
def test_it_keeps_sequences_valid_and_loses_nothing(tmp_path_factory: pytest.TempPathFactory,
                                                    messages: list[Message], strategy: str, soft_share: float,
                                                    rounds: int) -> None:
    check_sequence(messages, allow_pending_tail=False)
    store = ExternalStore(tmp_path_factory.mktemp("ext"))
    live = list(messages)
    dropped: list[Message] = []
    for _ in range(rounds):  # evicting an already evicted context must also be safe
        before = total(live)
        soft = max(2, int(before * soft_share))
        units = units_of(live)
        plan = plan_eviction(units, strategy=strategy, soft_limit=soft, hard_limit=soft * 2, target=max(1, soft // 2))
        assert_dependencies(plan, units)
        live, records = apply_plan(live, plan, store=store)
        check_sequence(live, allow_pending_tail=False)
        assert len({m.id for m in live}) == len(live)
        dropped.extend(Message.from_dict(d) for r in records for d in r.get("originals") or [])
    stored = [m for key in store.list_keys() for m in store.get(key)]
    live_by_id = {m.id: m for m in live}
    for original in messages:
        unchanged = live_by_id.get(original.id) == original
        recoverable = any(c == original for c in stored) or any(c == original for c in dropped)
        assert unchanged or recoverable, original.id


# -- replay comparison and purity --------------------------------------------------------------------------


@pytest.mark.corpus
def test_it_compares_the_policies_on_a_corpus_session(tmp_path) -> None:
    results = compare_policies(corpus_path("openhands/multi_swe_bench_output.ponylang__ponyc-4588.jsonl"),
                               tmp_path, profile=Profile(max_input_length=16_000))
    by_name = {r.name: r for r in results}
    assert set(by_name) == {"contextlab", "copaw", *STRATEGIES}
    for name in ("contextlab", *STRATEGIES):
        assert by_name[name].nothing_lost, by_name[name].verdict
        assert by_name[name].fired > 0 and max(by_name[name].tokens) <= 16_000
    for name in STRATEGIES:
        assert set(by_name[name].actions) <= {"summarize", "externalize", "drop"}
    assert by_name["copaw"].losses  # CoPaw's cuts are named
    assert (tmp_path / "comparison.json").exists()
    table = render(results, window=16_000)
    assert "hierarchical_quota" in table and "nothing lost" in table
