"""Long-term memory files, in CoPaw's layout: ``MEMORY.md`` and ``memory/YYYY-MM-DD.md``.

Seed 000 (last section) names three paths into long-term memory; this module
gives the engine the two it drives:

* at compaction, ``extract_memory_notes`` pulls personal preferences (the
  user's "I prefer…", "please always…", "don't…", "我喜欢…", "请…" sentences)
  and try-error lessons (a failed tool call followed later by a successful one
  on the same target: "X failed with E; Y worked") out of the messages, and
  ``append_daily_note`` merges them into today's note under ``## Preferences``
  and ``## Lessons``, with timestamps and without duplicates;
* the nightly job calls ``consolidate``: it merges the recent daily notes into
  ``MEMORY.md`` (per section, de-duplicated, newest wins when two preferences
  contradict, bounded), after copying the old file to
  ``backup/MEMORY-YYYYmmdd-HHMMSS.md``, and returns the unified diff.

The offline path needs no model. An optional ``summarizer`` (any
``Callable[[str], str]``, e.g. a thin wrapper around an OpenAI-compatible
client) may extract the notes instead; when it fails or answers without the two
sections, the offline notes are used. Only the two managed sections of a file
are ever rewritten: whatever else the agent keeps there stays as it was.
"""

from __future__ import annotations

import datetime as dt
import difflib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contextlab.engine.core.ansi import without_ansi
from contextlab.engine.core.messages import Message, ToolUseBlock
from contextlab.engine.memory.working import (
    call_file_events,
    call_outcome,
    command_program,
    describe_call,
    is_command_tool,
    is_request,
    one_line,
    sentences,
    text_of,
)

MEMORY_FILE = "MEMORY.md"
DAILY_DIR = "memory"
BACKUP_DIR = "backup"
PREFERENCES = "Preferences"
LESSONS = "Lessons"
SECTIONS = (PREFERENCES, LESSONS)
_ALIASES = {"preferences": PREFERENCES, "偏好": PREFERENCES, "个人偏好": PREFERENCES,
            "lessons": LESSONS, "经验": LESSONS, "经验教训": LESSONS}
MAX_ITEMS_PER_SECTION = 40
MAX_NOTE_CHARS = 240
# Longer user messages are pasted material or harness templates (a SWE-bench
# task statement), whose imperative sentences are not the person's preferences.
MAX_REQUEST_CHARS = 4_000

# A preference is personal: first-person ("I prefer", "I'd rather"), a standing
# instruction ("from now on", "in future"), or an imperative that opens the
# sentence ("Please always…", "Never…", "Don't…"). A "don't" in the middle of a
# harness template ("you don't need to install packages") is not one.
_PREFERENCE = re.compile(
    r"(?i:\bi (?:really |strongly )?(?:prefer|like|love|hate|dislike|want|don't want|do not want|would rather)\b"
    r"|\bi'd (?:rather|prefer|like)\b|\bmy preference\b|\bfrom now on\b|\bin (?:the )?future\b"
    r"|^(?:and |also |so )?(?:please\b|always\b|never\b|don't\b|do not\b))"
    r"|我(?:更|比较|很|不)?喜欢|我偏好|我希望|我习惯|请(?!问)|不要|别(?:再|用|改)|以后|总是|始终|务必"
)
_FENCE = re.compile(r"```.*?```", re.DOTALL)
_STAMP = re.compile(r"^\[[^\]]{4,20}\]\s*")
_BULLET = re.compile(r"^\s*[-*+]\s+(.*)$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_NEGATION = re.compile(r"(?i:\b(?:don't|do not|never|not|no longer|stop|avoid|dislike|hate)\b)|不要|不喜欢|别|避免|禁止|不")
_FILLER = re.compile(
    r"(?i:\b(?:please|always|i|i'd|we|you|prefer|like|love|want|to|use|using|the|a|an|should|must|would|rather"
    r"|really|from|now|on|in|future)\b)|请|总是|始终|我|喜欢|希望|使用|用|更|以后"
)
_PAIR = re.compile(r"^(.+?)\s+(?:over|instead of|rather than|than)\s+(.+)$")


@dataclass(frozen=True)
class MemoryNotes:
    preferences: list[str] = field(default_factory=list)
    lessons: list[str] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not self.preferences and not self.lessons


def normalise(note: str) -> str:
    """The comparison form of a note: no bullet, no stamp, no case, single spaces."""
    text = _BULLET.sub(r"\1", note).strip()
    text = _STAMP.sub("", text)
    return re.sub(r"\s+", " ", text).strip().rstrip(".。;；!！").casefold()


def _dedupe(items: Sequence[str]) -> list[str]:
    seen: dict[str, str] = {}
    for item in items:
        key = normalise(item)
        if key and key not in seen:
            seen[key] = item
    return list(seen.values())


# -- extraction ---------------------------------------------------------------------------------------


def preference_sentences(messages: Sequence[Message]) -> list[str]:
    out: list[str] = []
    for msg in messages:
        if not is_request(msg):
            continue
        text = text_of(msg)
        if len(text) > MAX_REQUEST_CHARS:
            continue
        for sentence in sentences(_FENCE.sub(" ", text)):
            if len(sentence) <= MAX_NOTE_CHARS and _PREFERENCE.search(sentence):
                out.append(sentence)
    return _dedupe(out)


def _target(use: ToolUseBlock) -> str:
    """What a call acts on, so a later call doing the same kind of thing to it can be recognised.

    A file target carries the kind of access: a failed edit followed by a
    successful read of the same file is not "what worked instead".
    """
    args = use.input
    command = args.get("command") or args.get("cmd")
    events = call_file_events(use, None, None)[0]
    if events and not (isinstance(command, str) and is_command_tool(use.name)):
        kind, path = events[0]
        return f"file-{kind}:{path}"
    if isinstance(command, str) and is_command_tool(use.name):
        return "cmd:" + command_program(command)
    if isinstance(args.get("url"), str):
        return "url:" + str(args["url"]).split("?")[0]
    return "tool:" + use.name


def try_error_lessons(messages: Sequence[Message]) -> list[str]:
    """"X failed with E; Y worked" for each target whose failure was followed by a different successful call."""
    results = {b.id: b for m in messages for b in m.tool_results}
    failures: dict[str, tuple[ToolUseBlock, str]] = {}
    lessons: list[str] = []
    seen: set[tuple[str, str, str, str]] = set()  # one lesson per (what failed, what worked)
    for msg in messages:
        for use in msg.tool_uses:
            outcome = call_outcome(use, results.get(use.id))
            if outcome.ok is None:
                continue
            target = _target(use)
            if not outcome.ok:
                failures[target] = (use, outcome.error or "an error")
                continue
            failed = failures.pop(target, None)
            if failed is None:
                continue
            before, error = failed
            if before.name == use.name and before.input == use.input:
                continue  # the same call again: a retry, not a lesson
            pair = (before.name, describe_call(before), use.name, describe_call(use))
            if pair in seen:
                continue
            seen.add(pair)
            lessons.append(one_line(
                f"{before.name} `{describe_call(before)}` failed with \"{one_line(error, 100)}\"; "
                f"{use.name} `{describe_call(use)}` worked", MAX_NOTE_CHARS * 2))
    return _dedupe(lessons)


LLM_PROMPT = """You maintain an agent's long-term memory. From the conversation below, extract:
1. personal preferences of the user (habits, likes and dislikes, standing instructions), and
2. try-error lessons (an approach that failed and what worked instead).
Answer in Markdown with exactly two sections, "## Preferences" and "## Lessons", one "- " bullet per
item, each self-contained and short. Write "- (none)" under a section with nothing to record.

Conversation:
"""


def _transcript_text(messages: Sequence[Message], limit: int = 12_000) -> str:
    lines: list[str] = []
    results = {b.id: b for m in messages for b in m.tool_results}
    for msg in messages:
        text = text_of(msg).strip()
        if text:
            lines.append(f"{msg.role}: {one_line(text, 600)}")
        for use in msg.tool_uses:
            outcome = call_outcome(use, results.get(use.id))
            status = "ok" if outcome.ok else f"failed: {outcome.error}" if outcome.ok is False else "no result"
            lines.append(f"tool call {use.name} `{describe_call(use)}` -> {status}")
    text = "\n".join(lines)
    return text if len(text) <= limit else text[: limit // 3] + "\n…\n" + text[-(limit * 2 // 3) :]


def parse_notes(text: str) -> MemoryNotes | None:
    """The two sections of a model's answer; None when either heading is missing."""
    sections = split_sections(text)[1]
    found = {name: bullets for name, (_, bullets) in ((n, _bullets(body)) for n, body in sections)}
    if not all(name in found for name in SECTIONS):
        return None
    keep = [b for b in found[PREFERENCES] if normalise(b) not in ("(none)", "none", "（无）", "无")]
    lessons = [b for b in found[LESSONS] if normalise(b) not in ("(none)", "none", "（无）", "无")]
    return MemoryNotes(_dedupe([_STAMP.sub("", b) for b in keep]), _dedupe([_STAMP.sub("", b) for b in lessons]))


def extract_memory_notes(
    messages: Sequence[Message], *, summarizer: Callable[[str], str] | None = None
) -> MemoryNotes:
    # Notes are read on pages and by the model: no terminal colour codes in them.
    messages = without_ansi(messages)
    offline = MemoryNotes(preference_sentences(messages), try_error_lessons(messages))
    if summarizer is None:
        return offline
    try:
        parsed = parse_notes(summarizer(LLM_PROMPT + _transcript_text(messages)))
    except Exception:  # any failure of the optional model path falls back to the offline notes
        return offline
    return parsed if parsed is not None else offline


# -- markdown sections --------------------------------------------------------------------------------

Section = tuple[str, list[str]]  # (canonical name or raw heading text, body lines)


def _canonical(title: str) -> str:
    return _ALIASES.get(title.strip().casefold(), title.strip())


def split_sections(text: str) -> tuple[list[str], list[Section]]:
    """(lines before the first ``##`` heading, [(name, body lines)]) of a Markdown file."""
    preamble: list[str] = []
    sections: list[Section] = []
    for line in text.split("\n"):
        match = _HEADING.match(line)
        if match and len(match.group(1)) == 2:
            sections.append((_canonical(match.group(2)), []))
        elif sections:
            sections[-1][1].append(line)
        else:
            preamble.append(line)
    return preamble, sections


def _bullets(body: Sequence[str]) -> tuple[list[str], list[str]]:
    """(other lines, bullet texts) of a section body."""
    other: list[str] = []
    bullets: list[str] = []
    for line in body:
        match = _BULLET.match(line)
        if match:
            bullets.append(match.group(1).strip())
        else:
            other.append(line)
    return other, bullets


def _render(preamble: list[str], sections: list[Section]) -> str:
    lines = list(preamble)
    while lines and not lines[-1].strip():
        lines.pop()
    for name, body in sections:
        if lines:
            lines.append("")
        lines.append(f"## {name}")
        trimmed = list(body)
        while trimmed and not trimmed[-1].strip():
            trimmed.pop()
        while trimmed and not trimmed[0].strip():
            trimmed.pop(0)
        lines.extend(trimmed)
    return "\n".join(lines).rstrip("\n") + "\n"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# -- daily notes -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoteUpdate:
    path: Path
    added: list[str]
    skipped: list[str]  # already present (normalised comparison)


def daily_note_path(workspace: str | Path, day: dt.date) -> Path:
    return Path(workspace) / DAILY_DIR / f"{day.isoformat()}.md"


def append_daily_note(workspace: str | Path, notes: MemoryNotes, *, day: dt.date, now: dt.datetime) -> NoteUpdate:
    """Merge ``notes`` into ``memory/<day>.md``; each new bullet is stamped ``[HH:MM]``."""
    path = daily_note_path(workspace, day)
    text = path.read_text(encoding="utf-8") if path.exists() else f"# {day.isoformat()}\n"
    preamble, sections = split_sections(text)
    added: list[str] = []
    skipped: list[str] = []
    stamp = now.strftime("%H:%M")
    for name, items in ((PREFERENCES, notes.preferences), (LESSONS, notes.lessons)):
        if not items:
            continue
        body = next((b for n, b in sections if n == name), None)
        if body is None:
            body = []
            sections.append((name, body))
        present = {normalise(b) for b in _bullets(body)[1]}
        while body and not body[-1].strip():
            body.pop()
        for item in items:
            key = normalise(item)
            if not key or key in present:
                skipped.append(item)
                continue
            present.add(key)
            body.append(f"- [{stamp}] {one_line(item, MAX_NOTE_CHARS * 2)}")
            added.append(item)
    if added:
        _write_atomic(path, _render(preamble, sections))
    return NoteUpdate(path, added, skipped)


def record_session_notes(
    workspace: str | Path,
    messages: Sequence[Message],
    *,
    day: dt.date,
    now: dt.datetime,
    summarizer: Callable[[str], str] | None = None,
) -> NoteUpdate:
    """The compaction-time path: extract from ``messages`` and merge into the day's note."""
    return append_daily_note(workspace, extract_memory_notes(messages, summarizer=summarizer), day=day, now=now)


# -- consolidation --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConsolidationResult:
    backup_path: Path | None  # None when MEMORY.md did not change (or did not exist before)
    diff: str  # unified diff of MEMORY.md, empty when nothing changed
    added: list[str]
    removed: list[str]


@dataclass(frozen=True)
class MemoryBackup:
    path: Path
    taken_at: dt.datetime


@dataclass
class _Entry:
    text: str
    date: str  # YYYY-MM-DD, "" when unknown (oldest)
    order: int


def _topic(text: str) -> tuple[str, bool] | None:
    """(topic, polarity) of a preference, to spot a newer one that contradicts it.

    "always use tabs" / "never use tabs" share the topic "tabs" with opposite
    polarity; "prefer tabs over spaces" / "prefer spaces over tabs" share the
    pair {spaces, tabs} in opposite order. None when no topic is left.
    """
    low = normalise(text)
    negative = bool(_NEGATION.search(low))
    stripped = _FILLER.sub(" ", _NEGATION.sub(" ", low))
    stripped = re.sub(r"\s+", " ", re.sub(r"[^\w\u4e00-\u9fff]+", " ", stripped)).strip()
    pair = _PAIR.match(stripped)
    if pair:
        a, b = pair.group(1).strip(), pair.group(2).strip()
        return f"pair:{min(a, b)}|{max(a, b)}", (a > b) != negative
    return (stripped, negative) if stripped else None


def _entries_from(bullets: Sequence[str], date: str, start: int) -> list[_Entry]:
    out: list[_Entry] = []
    for n, bullet in enumerate(bullets):
        stamp = re.match(r"^\[(\d{4}-\d{2}-\d{2})\]", bullet)
        out.append(_Entry(_STAMP.sub("", bullet).strip(), stamp.group(1) if stamp else date, start + n))
    return out


def consolidate(
    workspace: str | Path, *, days: int = 7, today: dt.date, now: dt.datetime
) -> ConsolidationResult:
    """Merge the daily notes of the last ``days`` days (today included) into MEMORY.md."""
    root = Path(workspace)
    memory_path = root / MEMORY_FILE
    old = memory_path.read_text(encoding="utf-8") if memory_path.exists() else ""
    preamble, sections = split_sections(old) if old else (["# Long-term memory"], [])
    current: dict[str, list[_Entry]] = {}
    counter = 0
    for name, body in sections:
        if name in SECTIONS:
            bullets = _bullets(body)[1]
            current.setdefault(name, []).extend(_entries_from(bullets, "", counter))
            counter += len(bullets)
    added: list[str] = []
    removed: list[str] = []
    for offset in range(days - 1, -1, -1):
        day = today - dt.timedelta(days=offset)
        path = daily_note_path(root, day)
        if not path.is_file():
            continue
        for name, body in split_sections(path.read_text(encoding="utf-8"))[1]:
            if name not in SECTIONS:
                continue
            entries = current.setdefault(name, [])
            for bullet in _bullets(body)[1]:
                text = _STAMP.sub("", bullet).strip()
                key = normalise(text)
                if not key or any(normalise(e.text) == key for e in entries):
                    continue
                topic = _topic(text) if name == PREFERENCES else None
                if topic is not None:
                    # Newest wins: a preference that this newer one contradicts goes.
                    for earlier in list(entries):
                        if _topic(earlier.text) == (topic[0], not topic[1]):
                            entries.remove(earlier)
                            removed.append(earlier.text)
                entries.append(_Entry(text, day.isoformat(), counter))
                counter += 1
                added.append(text)
    for name in SECTIONS:
        entries = current.get(name, [])
        if len(entries) > MAX_ITEMS_PER_SECTION:
            # Bounded: the oldest entries (undated ones first) leave.
            oldest = sorted(entries, key=lambda e: (e.date, e.order))[: len(entries) - MAX_ITEMS_PER_SECTION]
            for entry in oldest:
                entries.remove(entry)
                removed.append(entry.text)
    new_sections: list[Section] = []
    rendered: set[str] = set()
    for name, body in sections:
        if name in SECTIONS:
            if name in rendered:
                continue  # a repeated heading: its bullets were merged into the first one
            rendered.add(name)
            prose = [line for line in _bullets(body)[0] if line.strip()]
            new_sections.append((name, prose + [_entry_line(e) for e in current.get(name, [])]))
        else:
            new_sections.append((name, body))
    for name in SECTIONS:
        if current.get(name) and all(n != name for n, _ in sections):
            new_sections.append((name, [_entry_line(e) for e in current[name]]))
    new = _render(preamble, new_sections) if new_sections or old else ""
    # Added items that a later note removed again within this run are not "added".
    added = [a for a in added if a not in removed]
    if new == old:
        return ConsolidationResult(None, "", [], [])
    backup: Path | None = None
    if memory_path.exists():
        backup = _backup(root, memory_path, now)  # the backup is written before MEMORY.md changes
    _write_atomic(memory_path, new)
    diff = "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile="MEMORY.md (before)", tofile="MEMORY.md (after)"))
    return ConsolidationResult(backup, diff, added, removed)


def _entry_line(entry: _Entry) -> str:
    return f"- [{entry.date}] {entry.text}" if entry.date else f"- {entry.text}"


def _backup(root: Path, memory_path: Path, now: dt.datetime) -> Path:
    folder = root / BACKUP_DIR
    folder.mkdir(parents=True, exist_ok=True)
    base = f"MEMORY-{now.strftime('%Y%m%d-%H%M%S')}"
    target = folder / f"{base}.md"
    n = 1
    while target.exists() and target.read_bytes() != memory_path.read_bytes():
        target = folder / f"{base}-{n}.md"  # two runs in one second with different content
        n += 1
    target.write_bytes(memory_path.read_bytes())
    return target


def memory_history(workspace: str | Path) -> list[MemoryBackup]:
    """The backups of MEMORY.md, oldest first."""
    folder = Path(workspace) / BACKUP_DIR
    out: list[MemoryBackup] = []
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("MEMORY-*.md")):
        match = re.match(r"^MEMORY-(\d{8}-\d{6})", path.stem)
        if match:
            taken = dt.datetime.strptime(match.group(1), "%Y%m%d-%H%M%S")
            out.append(MemoryBackup(path, taken))
    return out
