"""Replay one transcript under several policies and compare what each did.

For every policy: tokens sent over turns, how often it fired, what it
summarized, externalized or dropped, and whether every original is still
recoverable. ``contextlab compare`` prints it; the dashboard can read the JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contextlab.engine.core.errors import ContextLabError
from contextlab.engine.core.profile import Profile
from contextlab.engine.importers import load_transcript
from contextlab.engine.replay.transcript import replay_transcript
from contextlab.engine.replay.verify import verify_replay

# (name, profile changes)
VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("contextlab", {"policy": "contextlab"}),
    ("copaw", {"policy": "copaw"}),
    ("lowest_score_first", {"policy": "eviction", "eviction_strategy": "lowest_score_first"}),
    ("sliding_window", {"policy": "eviction", "eviction_strategy": "sliding_window"}),
    ("hierarchical_quota", {"policy": "eviction", "eviction_strategy": "hierarchical_quota"}),
)
SPARK = "▁▂▃▄▅▆▇█"


@dataclass
class PolicyResult:
    name: str
    turns: int = 0
    fired: int = 0
    tokens: list[int] = field(default_factory=list)
    actions: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    losses: dict[str, int] = field(default_factory=dict)
    verdict: str = ""
    nothing_lost: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _collect(name: str, out: Path) -> PolicyResult:
    result = PolicyResult(name=name)
    for line in (out / "trace.jsonl").read_bytes().decode("utf-8").splitlines():
        trace = json.loads(line)
        result.turns += 1
        result.tokens.append(int(trace["payload"]["tokens"]["total"]))
        if trace["outcome"] in ("compacted", "fallback_summary", "evicted"):
            result.fired += 1
        for item in trace["copaw_losses"]:
            result.losses[item["name"]] = result.losses.get(item["name"], 0) + 1
        for step in trace["steps"]:
            if step["step"] == "mark_compressed" and step["status"] == "fired":
                count = int(step["numbers"]["archived"])
                result.actions["summarized"] = result.actions.get("summarized", 0) + count
                if len(result.examples) < 3:
                    result.examples.append(f"turn {trace['turn']}: {step['outcome']}")
            if step["step"] == "eviction" and step["status"] == "fired":
                for record in step["details"]["records"]:
                    action = record["action"]
                    result.actions[action] = result.actions.get(action, 0) + len(record["message_ids"])
                    if len(result.examples) < 3:
                        result.examples.append(f"turn {trace['turn']}: {action} ({record['reason']})")
    return result


def compare_policies(
    transcript: str | Path,
    out_dir: str | Path,
    *,
    profile: Profile | None = None,
    variants: tuple[tuple[str, dict[str, Any]], ...] = VARIANTS,
) -> list[PolicyResult]:
    base = profile or Profile()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ContextLabError(f"{out} is a file, not a folder; choose a folder for --out", field="out")
    messages = load_transcript(transcript).messages
    results: list[PolicyResult] = []
    for name, changes in variants:
        folder = out / name
        replay_transcript(transcript, folder, profile=base.replace(**changes), overwrite=True)
        result = _collect(name, folder)
        report = verify_replay(folder, messages)
        result.nothing_lost = report.ok
        result.verdict = report.summary_line()
        results.append(result)
    (out / "comparison.json").write_text(
        json.dumps([r.to_dict() for r in results], ensure_ascii=False, indent=1), encoding="utf-8")
    return results


def sparkline(values: list[int], width: int = 48) -> str:
    if not values:
        return ""
    step = max(1, len(values) // width + (1 if len(values) % width else 0))
    buckets = [max(values[i:i + step]) for i in range(0, len(values), step)]
    top = max(buckets) or 1
    return "".join(SPARK[min(len(SPARK) - 1, v * len(SPARK) // (top + 1))] for v in buckets)


def render(results: list[PolicyResult], *, window: int) -> str:
    lines = [f"{'policy':<20} {'fired':>5} {'peak':>8} {'final':>8}  tokens over turns (window {window:,})"]
    for r in results:
        peak = max(r.tokens, default=0)
        final = r.tokens[-1] if r.tokens else 0
        lines.append(f"{r.name:<20} {r.fired:>5} {peak:>8,} {final:>8,}  {sparkline(r.tokens)}")
    for r in results:
        lines.append("")
        lines.append(f"{r.name}: {r.verdict}")
        if r.actions:
            lines.append("  " + ", ".join(f"{count} message(s) {action}" for action, count in r.actions.items()))
        if r.losses:
            lines.append("  CoPaw losses: " + ", ".join(f"{name} ×{n}" for name, n in r.losses.items()))
        lines.extend(f"  {example}" for example in r.examples)
    return "\n".join(lines)
