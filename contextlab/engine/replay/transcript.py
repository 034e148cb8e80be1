"""Replay a recorded transcript through the hook, turn by turn.

A turn ends before each assistant message: the messages up to it are appended,
the hook runs, and its trace is written. The output folder is a workspace in
CoPaw's layout (``dialog/``, ``tool_result/``) plus ``trace.jsonl`` (one record
per turn) and ``final_context.json`` (what the LLM would get next).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from contextlab.engine.compactors.base import Compactor
from contextlab.engine.convert.openai import to_openai
from contextlab.engine.core.errors import ContextLabError
from contextlab.engine.core.profile import Profile
from contextlab.engine.hook import ContextManager, TurnResult, replay_turns
from contextlab.engine.importers import Transcript, load_transcript

# Everything a replay may write into its folder: --overwrite removes all of it,
# so no file of an earlier run (an externalized unit, a memory note) survives
# into the next one and is mistaken for its output.
OUTPUT_NAMES = ("trace.jsonl", "final_context.json", "dialog", "tool_result", "summaries.json", "ledger.json",
                "fate.json", "externalized", "memory", "MEMORY.md", "backup", ".uncommitted.json")
OUTPUT_PATTERNS = ("compact_invalid_*.json",)


@dataclass
class ReplayReport:
    transcript: str
    format: str
    out_dir: str
    messages: int
    turns: int = 0
    compactions: int = 0
    evictions: int = 0
    failures: int = 0
    archived: int = 0
    live: int = 0
    final_tokens: int = 0
    tool_definitions: int = 0
    tool_tokens: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    def summary_line(self) -> str:
        fired = f"{self.compactions} compaction(s)" + (f", {self.evictions} eviction(s)" if self.evictions else "")
        tools = (f", {self.tool_definitions} tool definition(s) ({self.tool_tokens:,} tokens a request)"
                 if self.tool_definitions else "")
        return (f"{self.transcript}: {self.format}, {self.messages} messages{tools}, {self.turns} turns, "
                f"{fired}, {self.failures} failure(s), {self.archived} archived, "
                f"{self.live} live, final payload {self.final_tokens:,} tokens ({self.seconds:.1f} s)")


class Progress:
    """A one-line progress display on a terminal, sparse lines elsewhere."""

    def __init__(self, total: int, label: str, stream: TextIO | None) -> None:
        self.total = max(total, 1)
        self.label = label
        self.stream = stream
        self.tty = bool(stream and stream.isatty())
        self._last_decile = -1

    def update(self, done: int, compactions: int) -> None:
        if self.stream is None:
            return
        percent = min(100, done * 100 // self.total)
        text = f"{self.label}: message {done}/{self.total} ({percent}%), {compactions} compaction(s)"
        if self.tty:
            self.stream.write("\r" + text)
            self.stream.flush()
        elif percent // 10 != self._last_decile:
            self._last_decile = percent // 10
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def prepare_out_dir(out_dir: Path, *, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ContextLabError(f"{out_dir} is a file, not a folder; choose a folder for --out", field="out")
    existing = [name for name in OUTPUT_NAMES if (out_dir / name).exists()]
    if out_dir.is_dir():
        existing.extend(sorted(p.name for pattern in OUTPUT_PATTERNS for p in out_dir.glob(pattern)))
    if existing and not overwrite:
        raise ContextLabError(
            f"{out_dir} already holds a replay ({', '.join(existing)}); choose another --out or pass --overwrite",
            field="out",
        )
    for name in existing:
        target = out_dir / name
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)


def replay_transcript(
    transcript: str | Path,
    out_dir: str | Path,
    *,
    profile: Profile | None = None,
    compactor: Compactor | None = None,
    overwrite: bool = False,
    progress: TextIO | None = None,
    on_turn: Callable[[TurnResult], None] | None = None,
) -> ReplayReport:
    profile = profile or Profile()
    source = load_transcript(transcript)
    out = Path(out_dir)
    created = not out.exists()
    prepare_out_dir(out, overwrite=overwrite)
    try:
        return _replay(source, transcript, out, profile=profile, compactor=compactor, progress=progress,
                       on_turn=on_turn)
    except BaseException:
        if created:
            # The folder is ours alone: a failed run leaves nothing behind to be
            # mistaken for a result.
            shutil.rmtree(out, ignore_errors=True)
        raise


def _replay(
    source: Transcript,
    transcript: str | Path,
    out: Path,
    *,
    profile: Profile,
    compactor: Compactor | None,
    progress: TextIO | None,
    on_turn: Callable[[TurnResult], None] | None,
) -> ReplayReport:
    manager = ContextManager(
        profile,
        out,
        system_prompt=source.system_prompt or "",
        compactor=compactor,  # None: the profile's compactor
        # The tool definitions the transcript records were part of every
        # request it made: the budget and the payload count them as a layer.
        tools=source.tools or None,
    )
    report = ReplayReport(transcript=str(transcript), format=source.format, out_dir=str(out),
                          messages=len(source.messages), warnings=list(source.warnings),
                          tool_definitions=len(manager.tools), tool_tokens=manager.schema_tokens)
    bar = Progress(len(source.messages), Path(transcript).name, progress)
    started = time.perf_counter()
    with (out / "trace.jsonl").open("w", encoding="utf-8") as trace_file:

        def record(result: TurnResult, done: int) -> None:
            trace = result.trace
            trace_file.write(json.dumps(trace.to_dict(), ensure_ascii=False) + "\n")
            report.turns += 1
            if trace.outcome in ("compacted", "fallback_summary"):
                report.compactions += 1
            if trace.outcome == "evicted":
                report.evictions += 1
            if trace.outcome in ("compaction_failed", "fallback_summary"):
                report.failures += 1
            bar.update(done, report.compactions)
            if on_turn is not None:
                on_turn(result)

        final = replay_turns(source.messages, manager, on_turn=record)
    bar.close()
    assert final is not None
    report.seconds = time.perf_counter() - started
    report.archived = len(manager.archived_ids)
    report.live = len(manager.messages)
    report.final_tokens = int(final.trace.payload["tokens"]["total"])
    write_final_context(out, manager, final, source_info={
        "path": str(transcript), "format": source.format, "warnings": source.warnings})
    return report


def write_final_context(out: Path, manager: ContextManager, final: TurnResult, *,
                        source_info: dict[str, Any]) -> None:
    data = {
        "messages": to_openai(final.payload),
        "summary": manager.summary,
        "summary_version": manager.summary_version,
        "system_prompt": manager.system_prompt,
        "tools": manager.tools,
        "live_message_ids": manager.live_ids(),
        "archived_message_ids": list(manager.archived_ids),
        "externalized": dict(manager.externalized),
        "pinned_message_ids": final.trace.payload.get("pinned_message_ids", []),
        "live_messages": [m.to_dict() for m in manager.messages],
        "tokens": final.trace.payload.get("tokens", {}),
        "turns": manager.turn,
        "policy": manager.profile.policy,
        "profile": manager.profile.to_dict(),
        "source": source_info,
    }
    (out / "final_context.json").write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    (out / "summaries.json").write_text(
        json.dumps([s.to_dict() for s in manager.summaries], ensure_ascii=False, indent=1), encoding="utf-8")
    (out / "ledger.json").write_text(
        json.dumps(list(manager.ledger.values()), ensure_ascii=False, indent=1), encoding="utf-8")
    (out / "fate.json").write_text(json.dumps(manager.fate, ensure_ascii=False), encoding="utf-8")


def default_progress_stream() -> TextIO:
    return sys.stderr
