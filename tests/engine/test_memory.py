"""Long-term memory files: extraction, daily notes, consolidation into MEMORY.md."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from contextlab.engine.core.messages import Message, ToolResultBlock, ToolUseBlock
from contextlab.engine.memory import long_term as memory_module
from contextlab.engine.memory.long_term import (
    MAX_ITEMS_PER_SECTION,
    MemoryNotes,
    append_daily_note,
    consolidate,
    extract_memory_notes,
    memory_history,
    record_session_notes,
)
from tests.engine.sessions import assistant, user

TZ = dt.timezone(dt.timedelta(hours=8))
DAY = dt.date(2026, 3, 20)
NOW = dt.datetime(2026, 3, 20, 23, 59, 30, tzinfo=TZ)


def call(call_id: str, name: str, args: dict[str, Any], output: str, *, is_error: bool = False) -> list[Message]:
    use = ToolUseBlock(call_id, name, args)
    return [Message(role="assistant", content=(use,), id=f"a{call_id}"),
            Message(role="tool", content=(ToolResultBlock(call_id, name, output, is_error),), id=f"t{call_id}")]


def session() -> list[Message]:
    return [
        user("Set up the frontend. I prefer pnpm over npm. Please always run the linter before committing."),
        *call("1", "bash", {"command": "npm install"}, "npm ERR! code ERESOLVE\n[exit code 1]", is_error=True),
        *call("2", "bash", {"command": "pnpm install"}, "Done in 4.2s"),
        *call("3", "bash", {"command": "pnpm lint"}, "0 problems"),
        *call("4", "bash", {"command": "pnpm lint"}, "0 problems"),
        assistant("Installed with pnpm."),
        user("不要修改 package.json 的版本号。我喜欢简短的提交信息。"),
    ]


def test_it_extracts_preferences_and_try_error_lessons_offline() -> None:
    notes = extract_memory_notes(session())
    assert notes.preferences == ["I prefer pnpm over npm.", "Please always run the linter before committing.",
                                 "不要修改 package.json 的版本号。", "我喜欢简短的提交信息。"]
    assert notes.lessons == ['bash `npm install` failed with "npm ERR! code ERESOLVE"; bash `pnpm install` worked']


def test_it_ignores_a_plain_retry_and_harness_boilerplate() -> None:
    messages = [
        user("Fix it. This means you DON'T have to modify the tests."),
        *call("1", "bash", {"command": "make"}, "Error 1\n[exit code 2]"),
        *call("2", "bash", {"command": "make"}, "ok\n[exit code 0]"),
    ]
    assert extract_memory_notes(messages) == MemoryNotes([], [])


def test_it_uses_a_model_when_it_answers_with_both_sections_and_falls_back_otherwise() -> None:
    seen: list[str] = []

    def model(prompt: str) -> str:
        seen.append(prompt)
        return "## Preferences\n- Uses pnpm\n\n## Lessons\n- (none)\n"

    assert extract_memory_notes(session(), summarizer=model) == MemoryNotes(["Uses pnpm"], [])
    assert "tool call bash `npm install` -> failed" in seen[0]
    offline = extract_memory_notes(session())
    assert extract_memory_notes(session(), summarizer=lambda _: "[SILENT]") == offline

    def broken(_: str) -> str:
        raise TimeoutError("model timed out")

    assert extract_memory_notes(session(), summarizer=broken) == offline


def test_it_merges_daily_notes_without_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "memory" / "2026-03-20.md"
    path.parent.mkdir()
    path.write_text("# 2026-03-20\n\nThe agent's own log line.\n\n## Preferences\n- [08:00] I prefer pnpm over npm.\n",
                    encoding="utf-8")
    first = append_daily_note(tmp_path, MemoryNotes(["i prefer PNPM over npm", "Dark mode everywhere"],
                                                    ["X failed; Y worked"]),
                              day=DAY, now=dt.datetime(2026, 3, 20, 10, 42, tzinfo=TZ))
    assert first.added == ["Dark mode everywhere", "X failed; Y worked"]
    assert first.skipped == ["i prefer PNPM over npm"]
    second = append_daily_note(tmp_path, MemoryNotes(["dark mode  everywhere."], ["x failed; y worked"]),
                               day=DAY, now=NOW)
    assert second.added == [] and len(second.skipped) == 2
    assert path.read_text(encoding="utf-8") == (
        "# 2026-03-20\n\nThe agent's own log line.\n\n"
        "## Preferences\n- [08:00] I prefer pnpm over npm.\n- [10:42] Dark mode everywhere\n\n"
        "## Lessons\n- [10:42] X failed; Y worked\n"
    )


def test_it_records_session_notes_at_compaction(tmp_path: Path) -> None:
    update = record_session_notes(tmp_path, session(), day=DAY, now=NOW)
    assert update.path == tmp_path / "memory" / "2026-03-20.md"
    text = update.path.read_text(encoding="utf-8")
    assert text.startswith("# 2026-03-20\n\n## Preferences\n- [23:59] I prefer pnpm over npm.")
    assert "## Lessons\n- [23:59] bash `npm install` failed" in text


def write_daily(root: Path, day: dt.date, preferences: list[str], lessons: list[str]) -> None:
    append_daily_note(root, MemoryNotes(preferences, lessons), day=day,
                      now=dt.datetime.combine(day, dt.time(12, 0), tzinfo=TZ))


def test_it_consolidates_with_a_backup_first_and_a_diff(tmp_path: Path) -> None:
    old = "# MEMORY\n\n## Tool Setup\n- Use the staging API key from the vault.\n\n## Preferences\n- [2026-03-01] Always use tabs\n"
    (tmp_path / "MEMORY.md").write_text(old, encoding="utf-8")
    write_daily(tmp_path, DAY - dt.timedelta(days=1), ["I prefer pnpm over npm"], ["`npm install` failed; `pnpm install` worked"])
    write_daily(tmp_path, DAY, ["Never use tabs"], [])
    write_daily(tmp_path, DAY - dt.timedelta(days=9), ["Too old to be merged"], [])

    result = consolidate(tmp_path, days=7, today=DAY, now=NOW)

    assert result.backup_path == tmp_path / "backup" / "MEMORY-20260320-235930.md"
    assert result.backup_path.read_text(encoding="utf-8") == old
    new = (tmp_path / "MEMORY.md").read_text(encoding="utf-8")
    assert new == (
        "# MEMORY\n\n## Tool Setup\n- Use the staging API key from the vault.\n\n"
        "## Preferences\n- [2026-03-19] I prefer pnpm over npm\n- [2026-03-20] Never use tabs\n\n"
        "## Lessons\n- [2026-03-19] `npm install` failed; `pnpm install` worked\n"
    )
    # Newest wins: "Never use tabs" replaced the older, contradicting preference.
    assert result.removed == ["Always use tabs"]
    assert result.added == ["I prefer pnpm over npm", "`npm install` failed; `pnpm install` worked", "Never use tabs"]
    assert result.diff.startswith("--- MEMORY.md (before)\n+++ MEMORY.md (after)\n")
    assert "-- [2026-03-01] Always use tabs\n" in result.diff
    assert "+- [2026-03-20] Never use tabs\n" in result.diff
    assert [b.path for b in memory_history(tmp_path)] == [result.backup_path]
    assert memory_history(tmp_path)[0].taken_at == dt.datetime(2026, 3, 20, 23, 59, 30)

    # A second run with nothing new changes nothing and writes no backup.
    again = consolidate(tmp_path, days=7, today=DAY, now=NOW + dt.timedelta(hours=1))
    assert (again.backup_path, again.diff, again.added, again.removed) == (None, "", [], [])
    assert (tmp_path / "MEMORY.md").read_text(encoding="utf-8") == new
    assert len(memory_history(tmp_path)) == 1


def test_it_writes_the_backup_before_touching_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "MEMORY.md").write_text("# MEMORY\n", encoding="utf-8")
    write_daily(tmp_path, DAY, ["Prefer short answers"], [])

    def disk_full(path: Path, text: str) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(memory_module, "_write_atomic", disk_full)
    with pytest.raises(OSError):
        consolidate(tmp_path, today=DAY, now=NOW)
    [backup] = memory_history(tmp_path)
    assert backup.path.read_text(encoding="utf-8") == "# MEMORY\n"
    assert (tmp_path / "MEMORY.md").read_text(encoding="utf-8") == "# MEMORY\n"


def test_it_creates_memory_and_keeps_it_bounded(tmp_path: Path) -> None:
    write_daily(tmp_path, DAY - dt.timedelta(days=1), [], [f"lesson number {i}" for i in range(30)])
    write_daily(tmp_path, DAY, [], [f"newer lesson {i}" for i in range(30)])
    result = consolidate(tmp_path, today=DAY, now=NOW)
    assert result.backup_path is None  # there was no MEMORY.md to back up
    text = (tmp_path / "MEMORY.md").read_text(encoding="utf-8")
    assert text.startswith("# Long-term memory\n\n## Lessons\n")
    bullets = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(bullets) == MAX_ITEMS_PER_SECTION
    assert result.removed == [f"lesson number {i}" for i in range(20)]  # the oldest left
    assert bullets[-1] == "- [2026-03-20] newer lesson 29"


def test_it_detects_contradictions_in_either_order_of_a_pair(tmp_path: Path) -> None:
    write_daily(tmp_path, DAY - dt.timedelta(days=2), ["I prefer spaces over tabs", "I like dark mode"], [])
    write_daily(tmp_path, DAY, ["I prefer tabs over spaces", "I don't like dark mode"], [])
    result = consolidate(tmp_path, today=DAY, now=NOW)
    assert result.removed == ["I prefer spaces over tabs", "I like dark mode"]
    assert "I prefer tabs over spaces" in (tmp_path / "MEMORY.md").read_text(encoding="utf-8")
