"""Transcripts that record the tool definitions they sent replay with them in the budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contextlab.engine.convert.openai import to_openai
from contextlab.engine.core.profile import Profile
from contextlab.engine.core.schemas import tool_tokens
from contextlab.engine.core.tokens import TiktokenCounter
from contextlab.engine.importers import load_transcript
from contextlab.engine.importers.swe_agent import tools_from_command_docs
from contextlab.engine.replay.transcript import replay_transcript
from tests.corpus import COPAW_RUN, corpus_path

OPENHANDS = "openhands/multi_swe_bench_output.ponylang__ponyc-4588.jsonl"
SWE_AGENT = "swe-agent/replay__marshmallow-1867__function_calling_replace_from_source.traj"
COUNTER = TiktokenCounter()


def traces(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "trace.jsonl").read_text(encoding="utf-8").splitlines()]


def test_it_carries_the_tools_of_the_openhands_system_event() -> None:
    transcript = load_transcript(corpus_path(OPENHANDS))
    assert [t["function"]["name"] for t in transcript.tools] == ["execute_bash", "think", "finish",
                                                                  "str_replace_editor"]


def test_it_rebuilds_the_tools_of_a_function_calling_swe_agent_run() -> None:
    transcript = load_transcript(corpus_path(SWE_AGENT))
    by_name = {t["function"]["name"]: t["function"] for t in transcript.tools}
    assert list(by_name)[:3] == ["bash", "goto", "open"] and "submit" in by_name
    assert by_name["open"]["parameters"]["required"] == ["path"]
    assert by_name["open"]["parameters"]["properties"]["line_number"]["type"] == "integer"
    # A docstring line such as "Tips:" at column 0 is part of the docstring, not a command.
    assert "Tips:" in by_name["edit"]["description"] and "Tips" not in by_name
    assert set(by_name["edit"]["parameters"]["properties"]) == {"search", "replace", "replace-all"}


def test_it_rebuilds_no_tools_from_empty_command_docs() -> None:
    assert tools_from_command_docs("") == []


def test_it_imports_a_recorded_copaw_request_with_its_tools() -> None:
    path = COPAW_RUN / "requests" / "0001.json"
    if not path.exists():
        pytest.skip("the CoPaw 1.0.2 run is not in the shared corpus")
    body = json.loads(path.read_text(encoding="utf-8"))["body"]
    transcript = load_transcript(path)
    assert transcript.format == "openai_request"
    assert transcript.tools == body["tools"] and len(transcript.tools) > 5
    assert len(transcript.messages) >= 1


def test_it_imports_a_bare_request_body_and_skips_malformed_tools(tmp_path: Path) -> None:
    good = tmp_path / "request.json"
    good.write_text(json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}],
                                "tools": [{"type": "function", "function": {"name": "ls"}}]}), encoding="utf-8")
    transcript = load_transcript(good)
    assert transcript.format == "openai_request" and transcript.tools[0]["function"]["name"] == "ls"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "ls"}]}),
                   encoding="utf-8")
    transcript = load_transcript(bad)
    assert transcript.tools == [] and any("tool definitions were not used" in w for w in transcript.warnings)


@pytest.mark.parametrize("relative", [OPENHANDS, SWE_AGENT])
def test_it_replays_with_the_recorded_tools_in_every_payload(relative: str, tmp_path: Path) -> None:
    tools = load_transcript(corpus_path(relative)).tools
    layer = tool_tokens(COUNTER, tools)
    assert layer > 300
    report = replay_transcript(corpus_path(relative), tmp_path / "out", profile=Profile(max_input_length=16_000))
    assert report.tool_definitions == len(tools) and report.tool_tokens == layer
    for trace in traces(tmp_path / "out"):
        tokens = trace["payload"]["tokens"]
        assert tokens["tools"] == layer
        assert tokens["total"] <= 16_000
    final = json.loads((tmp_path / "out" / "final_context.json").read_text(encoding="utf-8"))
    assert final["tools"] == tools


def test_it_compacts_earlier_with_the_recorded_tools_than_without(tmp_path: Path) -> None:
    # The same messages without the tools layer (an OpenAI message list) compact later.
    transcript = load_transcript(corpus_path(OPENHANDS))
    profile = Profile(max_input_length=8_000)
    with_tools = replay_transcript(corpus_path(OPENHANDS), tmp_path / "tools", profile=profile)
    first_with = next(t["turn"] for t in traces(tmp_path / "tools") if t["outcome"] == "compacted")
    plain = tmp_path / "plain.json"
    system = [{"role": "system", "content": transcript.system_prompt}] if transcript.system_prompt else []
    plain.write_text(json.dumps(system + to_openai(transcript.messages)), encoding="utf-8")
    replay_transcript(plain, tmp_path / "plain", profile=profile)
    first_plain = next(t["turn"] for t in traces(tmp_path / "plain") if t["outcome"] == "compacted")
    assert with_tools.tool_definitions == 4
    assert first_with < first_plain
