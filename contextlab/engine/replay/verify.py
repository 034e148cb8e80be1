"""Checking a replay's output: is every input message still somewhere, intact?

Every message ever ingested must be live in ``final_context.json``, in the
dialog archive, or (eviction policy) under ``externalized/``, with content
identical to what was ingested; truncated tool output counts as intact when
its ``tool_result`` file holds the original.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contextlab.engine.core.messages import Message
from contextlab.engine.policies.eviction import ExternalStore


def resolve_offloads(message: dict[str, Any], out: Path) -> dict[str, Any]:
    """A message dict with each truncated tool output replaced by its full original."""
    offload = message.get("metadata", {}).get("offload") or {}
    content = [dict(block) for block in message["content"]]
    for index, entry in (message.get("metadata", {}).get("offload_args") or {}).items():
        stored = json.loads((out / entry["file"]).read_bytes().decode("utf-8"))
        block = content[int(index)]
        block["input"] = stored["input"]
        if stored["raw_input"] is not None:
            block["raw_input"] = stored["raw_input"]
        else:
            block.pop("raw_input", None)
    for index, entry in offload.items():
        block = content[int(index)]
        # Bytes, not read_text: universal newlines would rewrite the original's \r\n.
        full = (out / entry["file"]).read_bytes().decode("utf-8")
        if isinstance(block["output"], str):
            block["output"] = full
        else:
            layout = entry.get("layout") or [{"text": len(full)}]
            media = [p for p in block["output"] if p["type"] != "text"]
            parts: list[dict[str, Any]] = []
            position = 0
            for item in layout:
                if "text" in item:
                    parts.append({"type": "text", "text": full[position:position + item["text"]]})
                    position += item["text"] + 1
                else:
                    parts.append(media[item["media"]])
            block["output"] = parts
    return {**message, "content": content}


def archive_records(out: Path) -> dict[str, dict[str, Any]]:
    """Every record of ``dialog/*.jsonl`` by message id (the last one wins)."""
    records: dict[str, dict[str, Any]] = {}
    for path in sorted((out / "dialog").glob("*.jsonl")):
        for line in path.read_bytes().decode("utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                records.setdefault(record["id"], record)
    return records


@dataclass
class VerifyReport:
    checked: int = 0
    live: int = 0
    archived: int = 0
    externalized: int = 0
    missing: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.changed

    def summary_line(self) -> str:
        verdict = "nothing lost" if self.ok else (
            f"{len(self.missing)} missing, {len(self.changed)} changed")
        return (f"{self.checked} messages: {self.live} live, {self.archived} archived, "
                f"{self.externalized} externalized — {verdict}")


def verify_replay(out: Path, messages: Sequence[Message]) -> VerifyReport:
    final = json.loads((out / "final_context.json").read_bytes().decode("utf-8"))
    live = {m["id"]: resolve_offloads(m, out) for m in final["live_messages"]}
    archived = archive_records(out)
    externalized: dict[str, str] = final.get("externalized") or {}
    store = ExternalStore(out)
    report = VerifyReport()
    for message in messages:
        report.checked += 1
        expected = message.to_dict()["content"]
        if message.id in live and live[message.id]["content"] == expected:
            report.live += 1
            continue
        if message.id in archived and archived[message.id]["content"] == expected:
            report.archived += 1
            continue
        if message.id in externalized:
            stored = {m.id: m for m in store.get(externalized[message.id])}
            if message.id in stored and resolve_offloads(stored[message.id].to_dict(), out)["content"] == expected:
                report.externalized += 1
                continue
        if message.id in live or message.id in archived or message.id in externalized:
            report.changed.append(message.id)
        else:
            report.missing.append(message.id)
    return report
