from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contextlab.engine.core.messages import Message
from contextlab.engine.stages.split import plan_split
from tests.engine.sessions import assistant, tool_round, user


def test_it_keeps_whole_turns_from_the_tail() -> None:
    msgs = [user("q1"), assistant("a1"), user("q2"), assistant("a2"), user("q3"), assistant("a3")]
    plan = plan_split(msgs, [10] * 6, reserve=40)
    assert plan.cut == 2  # 4 messages x 10 = 40 fits; the cut lands on a user message
    assert plan.compact == [0, 1] and plan.keep == [2, 3, 4, 5]
    assert plan.pinned is None and plan.cut_kind == "turn_start"


def test_it_never_keeps_an_answer_without_its_question() -> None:
    msgs = [user("q1"), assistant("a1"), user("q2"), assistant("a2")]
    plan = plan_split(msgs, [10, 10, 30, 10], reserve=30)  # CoPaw would keep a2 alone (C06)
    assert plan.keep == [2, 3] or plan.cut_kind == "nothing_fits"
    assert plan.compact == [0, 1]


def test_it_pins_the_newest_request_when_the_cut_lands_inside_its_turn() -> None:
    msgs = [user("fix the build"), *tool_round("bash", {"c": "make"}, ["x"]), *tool_round("bash", {"c": "ls"}, ["y"])]
    tokens = [5, 20, 50, 20, 10]
    plan = plan_split(msgs, tokens, reserve=40)
    assert plan.pinned == 0
    assert plan.cut == 3 and plan.compact == [1, 2] and plan.keep == [0, 3, 4]
    assert plan.cut_kind == "inside_newest_turn"


def test_it_keeps_parallel_results_with_their_call() -> None:
    msgs = [user("go"), *tool_round("search", {"q": "a"}, ["r1", "r2", "r3"])]
    plan = plan_split(msgs, [5, 10, 30, 5, 5], reserve=20)
    # No cut may land between the call (index 1) and its results.
    assert plan.cut in (1, 4) or plan.cut_kind == "nothing_fits"
    assert plan.cut == 1 and plan.cut_kind == "nothing_fits"


def _session(draw_kinds: list[int]) -> list[Message]:
    msgs: list[Message] = []
    for kind in draw_kinds:
        if kind == 0 or not msgs:
            msgs.append(user("question"))
        elif kind == 1:
            msgs.append(assistant("answer"))
        else:
            msgs.extend(tool_round("bash", {"c": "x"}, ["out"] * (kind - 1)))
    return msgs


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=40),
    st.lists(st.integers(min_value=1, max_value=200), min_size=200, max_size=200),
    st.integers(min_value=1, max_value=600),
)
def test_it_holds_the_split_invariants(kinds: list[int], sizes: list[int], reserve: int) -> None:
    msgs = _session(kinds)
    tokens = sizes[: len(msgs)]
    plan = plan_split(msgs, tokens, reserve=reserve)
    kept = [i for i in plan.keep if i != plan.pinned]
    # A contiguous suffix.
    assert kept == list(range(plan.cut, len(msgs)))
    # Everything is either compacted or kept, once.
    assert sorted(plan.compact + plan.keep) == list(range(len(msgs)))
    # The newest user message is never compacted.
    newest = max(i for i, m in enumerate(msgs) if m.is_user_turn)
    assert newest in plan.keep
    # No tool call is separated from its results.
    keep_set = set(plan.keep)
    for i, m in enumerate(msgs):
        for use in m.tool_uses:
            results = [j for j, r in enumerate(msgs) if any(b.id == use.id for b in r.tool_results)]
            assert all((j in keep_set) == (i in keep_set) for j in results)
    # The kept tokens respect the reserve unless nothing smaller could be kept.
    if plan.cut_kind != "nothing_fits":
        assert plan.kept_tokens <= reserve
