"""Small synthetic agent conversations, in OpenAI chat format, for the web-app tests."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEMO_CONVERSATION = REPO / "contextlab" / "sessions" / "demo_conversation.json"
# The shared corpus of real transcripts sits beside the repository unless told otherwise.
CORPUS = Path(os.environ.get("CONTEXTLAB_CORPUS_DIR") or REPO.parent / "shared" / "corpus" / "raw")
TAU_BENCH = CORPUS / "tau-bench" / "gpt-4o-airline.idx52.task2.trial1.json"


def log_output(n_bytes: int, *, tag: str = "build") -> str:
    """A tool output of about ``n_bytes`` bytes: numbered log lines."""
    lines: list[str] = []
    size = 0
    number = 0
    while size < n_bytes:
        number += 1
        line = f"[{tag}] step {number:04d}: compiled module_{number % 97:02d}.c in {number % 13 + 1} ms"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def tool_turn(i: int, *, output_bytes: int = 800, tool: str = "run_shell") -> list[dict[str, Any]]:
    """One exchange: the user asks, the assistant calls a tool, the tool answers."""
    call_id = f"call_{i}"
    return [
        {"role": "user", "content": f"Step {i}: build target t{i} and report the errors in /srv/app/t{i}.log"},
        {"role": "assistant", "content": f"Building t{i}.",
         "tool_calls": [{"id": call_id, "type": "function",
                         "function": {"name": tool, "arguments": json.dumps({"command": f"make t{i}"})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": log_output(output_bytes, tag=f"t{i}")},
    ]


def answer(i: int) -> dict[str, Any]:
    return {"role": "assistant", "content": f"Target t{i} built without errors."}


def many_codes(count: int = 120) -> dict[str, Any]:
    """A user message with more booking codes than a small window's summary line holds: the
    post-check puts the rest in the identifier index only."""
    return {"role": "user", "content": "Rebook " + " ".join(f"BK{n:03d}Z" for n in range(count)) + "."}


def lose_the_index(session: Any) -> None:
    """Delete the session's identifier index and check every summary version again: what only
    the index held is lost (the check reads what the model could read again)."""
    from contextlab.engine.stages.summary.identifiers import INDEX_FILE
    from contextlab.sessions import loss_records

    (session.workspace / INDEX_FILE).unlink()
    session.summary_versions.update(loss_scope=None)
    loss_records.record(session)
