"""Every policy but ``copaw`` holds the window on every turn, by an exact recount.

Hypothesis builds agent sessions (requests, answers, tool rounds with large
outputs and, sometimes, large call arguments) and replays them turn by turn
under the ``contextlab`` policy and each eviction strategy, at a few windows,
with up to 25 tool definitions in the budget.
After every turn the payload is recounted with tiktoken, independently of the
engine's own bookkeeping, and must fit the window; at the end every message
ever ingested must still be live, archived or externalized, intact.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextlab.engine.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock, check_sequence
from contextlab.engine.core.profile import Profile
from contextlab.engine.core.schemas import tool_tokens
from contextlab.engine.core.tokens import REPLY_PRIMING_TOKENS, TiktokenCounter
from contextlab.engine.hook import ContextManager, TurnResult, replay_turns
from contextlab.engine.replay.transcript import write_final_context
from contextlab.engine.replay.verify import verify_replay
from tests.engine.sessions import log_lines

RECOUNT = TiktokenCounter()
POLICIES: list[dict[str, str]] = [
    {"policy": "contextlab"},
    {"policy": "eviction", "eviction_strategy": "lowest_score_first"},
    {"policy": "eviction", "eviction_strategy": "sliding_window"},
    {"policy": "eviction", "eviction_strategy": "hierarchical_quota"},
]


@st.composite
def agent_sessions(draw: st.DrawFn) -> list[Message]:
    messages: list[Message] = []
    n = 0

    def next_id(prefix: str) -> str:
        nonlocal n
        n += 1
        return f"{prefix}{n}"

    for _ in range(draw(st.integers(1, 4))):
        messages.append(Message.text("user", draw(st.sampled_from(["fix the failing test", "write the report",
                                                                   "继续", "run the build"]))
                                     + " please" * draw(st.integers(0, 150)), id=next_id("u")))
        for _ in range(draw(st.integers(0, 12))):
            calls = draw(st.integers(0, 3))
            text = "Let me look. " * draw(st.integers(0, 40))
            if calls == 0:
                messages.append(Message.text("assistant", text or "done", id=next_id("a")))
                continue
            uses = []
            for _ in range(calls):
                if draw(st.booleans()):
                    args = {"command": f"make test-{draw(st.integers(0, 99))}"}
                else:  # a call whose arguments are a whole file (a report, a patch)
                    args = {"path": "report.md", "content": log_lines(draw(st.integers(0, 400)), "section")}
                uses.append(ToolUseBlock(id=next_id("c"), name=draw(st.sampled_from(["bash", "write_file"])),
                                         input=args))
            messages.append(Message(role="assistant", content=((TextBlock(text),) if text else ()) + tuple(uses),
                                    id=next_id("a")))
            messages.extend(
                Message(role="tool", content=(ToolResultBlock(id=u.id, name=u.name,
                                                              output=log_lines(draw(st.integers(0, 900))) or "ok"),),
                        id=next_id("t"))
                for u in uses)
    return messages


def payload_tokens(result: TurnResult, tools: list[dict]) -> int:
    return sum(RECOUNT.count_message(m) for m in result.payload) + tool_tokens(RECOUNT, tools) + REPLY_PRIMING_TOKENS


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(messages=agent_sessions(), variant=st.sampled_from(POLICIES), window=st.sampled_from([8_000, 12_000, 16_000]),
       tool_count=st.integers(0, 25))
def test_it_never_sends_a_payload_over_the_window(tmp_path_factory: pytest.TempPathFactory, messages: list[Message],
                                                  variant: dict[str, str], window: int, tool_count: int) -> None:
    workspace: Path = tmp_path_factory.mktemp("ws")
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "Run one step of the build.",
                                               "parameters": {"type": "object", "properties": {
                                                   "target": {"type": "string", "description": "What to build."}}}}}
             for i in range(tool_count)]
    manager = ContextManager(Profile(max_input_length=window).replace(**variant), workspace, tools=tools)
    sizes: list[int] = []

    def check(result: TurnResult, _index: int) -> None:
        sent = payload_tokens(result, tools)
        assert sent == result.trace.payload["tokens"]["total"]
        assert sent <= window, (variant, result.trace.turn, sent)
        check_sequence(result.payload[1:] if result.summary_message else result.payload)
        sizes.append(sent)

    final = replay_turns(messages, manager, on_turn=check)
    assert final is not None and sizes
    write_final_context(workspace, manager, final, source_info={})
    report = verify_replay(workspace, messages)
    assert report.ok, report.summary_line()
