"""Replays every transcript of the shared corpus and checks that nothing is lost.

With a 16,000-token window compaction fires many times on the larger sessions.
Every input message must end up either live in ``final_context.json`` or in the
dialog archive, with identical content (truncated tool output resolved through
its ``tool_result`` file), and the live part must be a valid provider payload.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contextlab.cli import main
from contextlab.engine.importers import load_transcript
from contextlab.engine.replay.verify import archive_records, resolve_offloads
from tests.corpus import TRANSCRIPTS, corpus_path

pytestmark = pytest.mark.corpus


def replay(relative: str, out: Path, *extra: str) -> dict[str, Any]:
    code = main(["replay", str(corpus_path(relative)), "--out", str(out), "--max-input-length", "16000",
                 "--quiet", *extra])
    assert code == 0
    final: dict[str, Any] = json.loads((out / "final_context.json").read_text(encoding="utf-8"))
    return final


def comparable(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # The archive writes original media parts of a list output unchanged too.
    return content


@pytest.mark.parametrize("relative", TRANSCRIPTS, ids=lambda r: Path(r).name[:40])
def test_it_replays_the_transcript_without_losing_a_message(relative: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    final = replay(relative, out)
    source = load_transcript(corpus_path(relative))
    live = {m["id"]: resolve_offloads(m, out) for m in final["live_messages"]}
    archived = archive_records(out)

    assert not set(live) & set(archived), "a message is both live and archived"
    for message in source.messages:
        expected = message.to_dict()["content"]
        if message.id in live:
            assert comparable(live[message.id]["content"]) == expected, message.id
        else:
            assert message.id in archived, f"message {message.id} is neither live nor archived"
            assert comparable(archived[message.id]["content"]) == expected, message.id
    assert set(live) | set(archived) == {m.id for m in source.messages}

    # The kept part is a contiguous suffix (after the pinned newest request).
    ids = [m.id for m in source.messages]
    pinned = final["pinned_message_ids"]
    suffix = [i for i in final["live_message_ids"] if i not in pinned]
    assert suffix == ids[len(ids) - len(suffix):]
    # The newest user message is live.
    users = [m.id for m in source.messages if m.is_user_turn]
    if users:
        assert users[-1] in live

    # No tool call is separated from its results in what the LLM gets.
    calls_seen: set[str] = set()
    open_calls: set[str] = set()
    for msg in final["messages"]:
        if msg["role"] == "tool":
            assert msg["tool_call_id"] in open_calls, "a tool result without its call"
            open_calls.discard(msg["tool_call_id"])
        else:
            assert not open_calls, f"calls {open_calls} lost their results"
        for call in msg.get("tool_calls") or []:
            calls_seen.add(call["id"])
            open_calls.add(call["id"])

    traces = [json.loads(line) for line in (out / "trace.jsonl").read_text(encoding="utf-8").splitlines()]
    assert traces and all(t["schema"] == "contextlab.trace/1" for t in traces)
    assert final["turns"] == len(traces)
    total_exact = traces[-1]["steps"][0]["numbers"]["messages_exact"]
    if len(archived) == 0:
        assert total_exact < 16000 * 0.7, "over the threshold, yet nothing was ever compacted"
    else:
        assert any(t["outcome"] in ("compacted", "fallback_summary") for t in traces)
        assert final["summary"] and "## " in final["summary"]
    assert final["tokens"]["total"] <= 16000


@pytest.mark.parametrize("relative", TRANSCRIPTS, ids=lambda r: Path(r).name[:40])
def test_it_replays_the_transcript_the_way_copaw_would(relative: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    final = replay(relative, out, "--policy", "copaw")
    traces = [json.loads(line) for line in (out / "trace.jsonl").read_text(encoding="utf-8").splitlines()]
    assert final["policy"] == "copaw" and traces
    assert all(t["policy"] == "copaw" and t["counter"].startswith("copaw:") for t in traces)


def test_it_shows_where_copaw_loses_context_on_the_corpus(tmp_path: Path) -> None:
    losses: set[str] = set()
    avoided: set[str] = set()
    for relative in ("openhands/multi_swe_bench_output.ponylang__ponyc-4588.jsonl",
                     "deer-flow/v1-replay/china-food-delivery.txt"):
        for policy, target in (("copaw", losses), ("contextlab", avoided)):
            out = tmp_path / policy / Path(relative).stem
            replay(relative, out, "--policy", policy)
            for line in (out / "trace.jsonl").read_text(encoding="utf-8").splitlines():
                trace = json.loads(line)
                target.update(f["name"] for f in trace["copaw_losses"] + trace["flaws_avoided"])
    assert "raw_byte_cut" in losses
    assert {"raw_byte_cut", "archive_truncated_text"} <= avoided


def test_it_flags_stale_reads_in_a_corpus_session(tmp_path: Path) -> None:
    out = tmp_path / "out"
    replay("swe-agent/replay__marshmallow-1867__function_calling_replace_from_source.traj", out)
    fate = json.loads((out / "fate.json").read_text(encoding="utf-8"))
    stale = {mid: e for mid, events in fate.items() for e in events if e["event"] == "stale"}
    assert stale["swe_agent-19"]["written_by"] == "swe_agent-20"
    assert stale["swe_agent-19"]["path"].endswith("src/marshmallow/fields.py")
