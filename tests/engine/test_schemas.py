"""Tool definitions and response-format schemas as a fixed layer of the budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextlab.engine.core.errors import MalformedInput
from contextlab.engine.core.profile import Profile
from contextlab.engine.core.schemas import (
    ENUM_TOKENS,
    ENUM_VALUE_TOKENS,
    FUNCTION_TOKENS,
    PARAMETER_TOKENS,
    PARAMETERS_TOKENS,
    TOOLS_END_TOKENS,
    response_format_tokens,
    tool_tokens,
)
from contextlab.engine.core.tokens import TiktokenCounter
from contextlab.engine.hook import ContextManager
from tests.engine.sessions import tool_round, user

COUNTER = TiktokenCounter()


def tool(i: int) -> dict:
    return {"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Does thing number {i} to the repository and reports what changed.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "File or folder to work on."},
            "mode": {"type": "string", "enum": ["fast", "thorough"], "description": "How hard to try"},
            "options": {"type": "object", "properties": {"dry_run": {"type": "boolean"}}},
        }, "required": ["path"]}}}


def test_it_counts_one_tool_by_the_documented_formula() -> None:
    expected = (TOOLS_END_TOKENS + FUNCTION_TOKENS
                + COUNTER.count_text("tool_1:Does thing number 1 to the repository and reports what changed.")
                + PARAMETERS_TOKENS
                + PARAMETER_TOKENS + COUNTER.count_text("path:string:File or folder to work on")
                + PARAMETER_TOKENS + ENUM_TOKENS + 2 * ENUM_VALUE_TOKENS + COUNTER.count_text("fast")
                + COUNTER.count_text("thorough") + COUNTER.count_text("mode:string:How hard to try")
                + PARAMETER_TOKENS + COUNTER.count_text("options:object:")
                + PARAMETERS_TOKENS + PARAMETER_TOKENS + COUNTER.count_text("dry_run:boolean:"))
    assert tool_tokens(COUNTER, [tool(1)]) == expected
    assert tool_tokens(COUNTER, []) == 0


def test_it_counts_forty_tool_schemas_in_the_thousands() -> None:
    tokens = tool_tokens(COUNTER, [tool(i) for i in range(40)])
    assert 40 * 50 < tokens < 40 * 120


def test_it_counts_a_json_schema_response_format_and_not_a_plain_one() -> None:
    schema = {"type": "object", "properties": {"verdict": {"type": "string"}, "files": {"type": "array"}}}
    structured = {"type": "json_schema", "json_schema": {"name": "review", "schema": schema}}
    assert response_format_tokens(COUNTER, structured) == COUNTER.count_text("review") + COUNTER.count_text(
        '{"type":"object","properties":{"verdict":{"type":"string"},"files":{"type":"array"}}}')
    assert response_format_tokens(COUNTER, {"type": "json_object"}) == 0


def test_it_puts_the_schemas_in_the_budget_and_compacts_earlier(tmp_path: Path) -> None:
    profile = Profile(max_input_length=16_000)
    tools = [tool(i) for i in range(40)]
    plain = ContextManager(profile, tmp_path / "plain")
    with_tools = ContextManager(profile, tmp_path / "tools", tools=tools)
    layer = tool_tokens(COUNTER, tools)
    over_threshold: dict[str, int] = {}
    first_compaction: dict[str, int] = {}
    for name, manager in (("plain", plain), ("tools", with_tools)):
        manager.append([user("Fix the build.")])
        for i in range(60):
            manager.append(tool_round("bash", {"command": f"make {i}"}, ["error: undefined symbol foo in module bar\n" * 40]))
            result = manager.prepare()
            tokens = result.trace.payload["tokens"]
            assert tokens["tools"] == (layer if name == "tools" else 0)
            # The schemas are sent with every request: the window holds them too, on every turn.
            assert tokens["total"] <= profile.max_input_length
            check = result.trace.get("context_check")
            assert check is not None
            if "keep everything" not in check.outcome:
                over_threshold.setdefault(name, i)
            if result.trace.outcome == "compacted":
                first_compaction.setdefault(name, i)
    # The schemas take room under the threshold, so it is reached turns earlier. The compaction
    # itself may wait until it frees a full band (see ``minimum_gain``), never past the window.
    assert over_threshold["tools"] < over_threshold["plain"]
    assert first_compaction["tools"] <= first_compaction["plain"]
    gate = with_tools.traces[-1].get("gate")
    assert gate is not None and gate.numbers["tools_tokens"] == layer


def test_it_keeps_the_schemas_across_a_saved_state(tmp_path: Path) -> None:
    profile = Profile(max_input_length=16_000)
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}
    manager = ContextManager(profile, tmp_path / "ws", tools=[tool(1)], response_format=fmt)
    restored = ContextManager.from_state(profile, tmp_path / "ws", manager.export_state())
    assert restored.tools == [tool(1)] and restored.response_format == fmt
    assert restored.schema_tokens == manager.schema_tokens > 0


@pytest.mark.parametrize(("tools", "field"), [({"name": "x"}, "tools"), ([{"type": "function"}], "tools[0]")])
def test_it_refuses_malformed_tools(tmp_path: Path, tools: object, field: str) -> None:
    with pytest.raises(MalformedInput) as info:
        ContextManager(Profile(), tmp_path / "ws", tools=tools)  # type: ignore[arg-type]
    assert info.value.field == field
