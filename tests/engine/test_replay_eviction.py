"""Replays the corpus under each eviction strategy and checks that nothing is lost.

Evicted originals are either in the dialog archive (dropped) or under
``externalized/`` (summarized or externalized), with the full tool output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contextlab.cli import main
from contextlab.engine.importers import load_transcript
from contextlab.engine.policies.eviction import ExternalStore
from contextlab.engine.replay.verify import archive_records, resolve_offloads, verify_replay
from tests.corpus import TRANSCRIPTS, corpus_path

pytestmark = pytest.mark.corpus

STRATEGIES = ("lowest_score_first", "sliding_window", "hierarchical_quota")


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("relative", TRANSCRIPTS, ids=lambda r: Path(r).name[:32])
def test_it_evicts_without_losing_a_message(relative: str, strategy: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = main(["replay", str(corpus_path(relative)), "--out", str(out), "--max-input-length", "16000",
                 "--policy", "eviction", "--strategy", strategy, "--quiet"])
    assert code == 0
    final: dict[str, Any] = json.loads((out / "final_context.json").read_text(encoding="utf-8"))
    live = {m["id"]: resolve_offloads(m, out) for m in final["live_messages"]}
    archived = archive_records(out)
    store = ExternalStore(out)
    externalized = final["externalized"]

    for message in load_transcript(corpus_path(relative)).messages:
        expected = message.to_dict()["content"]
        found = []
        if message.id in live:
            found.append(live[message.id]["content"])
        if message.id in archived:
            found.append(archived[message.id]["content"])
        if message.id in externalized:
            stored = {m.id: m for m in store.get(externalized[message.id])}
            found.append(resolve_offloads(stored[message.id].to_dict(), out)["content"])
        assert found, f"{message.id} is neither live, archived nor externalized"
        assert expected in found, f"no copy of {message.id} equals the original"

    assert verify_replay(out, load_transcript(corpus_path(relative)).messages).ok
    traces = [json.loads(line) for line in (out / "trace.jsonl").read_text(encoding="utf-8").splitlines()]
    for trace in traces:
        eviction = next(s for s in trace["steps"] if s["step"] == "eviction")
        if eviction["status"] == "fired":
            plan = eviction["details"]["plan"]
            assert all("score" in a and a["reason"] for a in plan["actions"] if a["action"] != "keep")
    # Provider-valid payload: every tool result follows its call.
    open_calls: set[str] = set()
    for msg in final["messages"]:
        if msg["role"] == "tool":
            assert msg["tool_call_id"] in open_calls
            open_calls.discard(msg["tool_call_id"])
        else:
            assert not open_calls
        open_calls.update(call["id"] for call in msg.get("tool_calls") or [])
