"""The dialog archive: ``dialog/YYYY-MM-DD.jsonl``, one message per line.

Messages removed from the live context are appended here before they are
removed (a crash in between leaves a duplicate line at worst, never a loss).
Each record is the message's own JSON form plus the turn and summary version
that removed it; the ``contextlab`` policy writes the original content, full
tool output included, dated in UTC.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contextlab.engine.core.messages import Message
from contextlab.engine.core.paths import UnsafePath, workspace_path


@dataclass(frozen=True)
class ArchiveLocation:
    file: str  # workspace-relative, e.g. "dialog/2026-03-20.jsonl"
    line: int  # 1-based

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line}


def utc_date_of(message: Message) -> str:
    """The UTC calendar date of an ISO 8601 timestamp (our timestamps are UTC)."""
    return message.timestamp[:10]


class DialogArchive:
    """The per-workspace dialog archive.

    With a journal (``append(..., journal_turn=N)``) the archive can take part
    in a caller's transaction: the file sizes before the first append of a turn
    are written to ``dialog/.uncommitted.json``; ``commit()`` deletes it once the
    caller has saved its own state, and ``recover(committed_turn)`` on the next
    load truncates the files back if that turn's state was never saved (a crash
    between the archive write and the caller's commit), so a message is never
    archived twice and never lost.
    """

    folder_name = "dialog"
    journal_name = ".uncommitted.json"

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.folder = workspace / self.folder_name
        self._line_counts: dict[str, int] = {}

    def _lines_in(self, path: Path) -> int:
        key = path.name
        if key not in self._line_counts:
            if path.exists():
                with path.open("rb") as fh:
                    self._line_counts[key] = sum(1 for _ in fh)
            else:
                self._line_counts[key] = 0
        return self._line_counts[key]

    def append(
        self,
        records: Sequence[tuple[Message, dict[str, Any]]],
        *,
        date_for: Callable[[Message], str] = utc_date_of,
        serialise: Callable[[Message], dict[str, Any]] | None = None,
        journal_turn: int | None = None,
    ) -> list[ArchiveLocation]:
        """Append messages (with extra fields per record); return where each landed."""
        self.folder.mkdir(parents=True, exist_ok=True)
        by_file: dict[str, list[tuple[int, str]]] = {}
        for position, (message, extra) in enumerate(records):
            data = serialise(message) if serialise else message.to_dict()
            data.update(extra)
            line = json.dumps(data, ensure_ascii=False)
            by_file.setdefault(f"{date_for(message)}.jsonl", []).append((position, line))
        if journal_turn is not None:
            self._journal(journal_turn, list(by_file))
        locations: list[ArchiveLocation | None] = [None] * len(records)
        for file_name, lines in by_file.items():
            path = self.folder / file_name
            start = self._lines_in(path)
            with path.open("a", encoding="utf-8") as fh:
                for offset, (position, line) in enumerate(lines):
                    fh.write(line + "\n")
                    locations[position] = ArchiveLocation(f"{self.folder_name}/{file_name}", start + offset + 1)
                fh.flush()
                os.fsync(fh.fileno())
            self._line_counts[file_name] = start + len(lines)
        return [loc for loc in locations if loc is not None]

    # -- the journal ---------------------------------------------------------------
    @property
    def journal_path(self) -> Path:
        return self.folder / self.journal_name

    def _journal(self, turn: int, file_names: list[str]) -> None:
        journal = self._read_journal() or {"turn": turn, "files": {}}
        journal["turn"] = turn
        for name in file_names:
            if name not in journal["files"]:
                path = self.folder / name
                journal["files"][name] = {"bytes": path.stat().st_size if path.exists() else 0,
                                          "lines": self._lines_in(path)}
        tmp = self.journal_path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(journal, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.journal_path)

    def _read_journal(self) -> dict[str, Any] | None:
        if not self.journal_path.exists():
            return None
        data: dict[str, Any] = json.loads(self.journal_path.read_text(encoding="utf-8"))
        return data

    def commit(self, *, turn: int | None = None) -> None:
        """The caller saved the state that these appends belong to.

        With ``turn``, a journal of a later turn (another writer that started
        after this one saved) is left alone.
        """
        if turn is not None:
            journal = self._read_journal()
            if journal is not None and int(journal["turn"]) > turn:
                return
        self.journal_path.unlink(missing_ok=True)

    def recover(self, *, committed_turn: int) -> list[str]:
        """Undo the appends of a turn whose state was never saved; returns the files cut back.

        A journal for a turn the caller did save (the crash came after its
        commit, before ``commit()``) is simply cleared.
        """
        journal = self._read_journal()
        if journal is None:
            return []
        restored: list[str] = []
        if int(journal["turn"]) > committed_turn:
            for name, before in journal["files"].items():
                path = self._journalled_file(name)
                if path is None:
                    continue
                if path.exists() and path.stat().st_size > before["bytes"]:
                    with path.open("r+b") as fh:
                        fh.truncate(before["bytes"])
                        fh.flush()
                        os.fsync(fh.fileno())
                    restored.append(f"{self.folder_name}/{name}")
                self._line_counts[name] = int(before["lines"])
        self.commit()
        return restored

    def _journalled_file(self, name: Any) -> Path | None:
        """The archive file a journal entry names, or None when the entry names anything else.

        The journal is only ever written with bare ``*.jsonl`` names of this
        folder; any other entry (``../..``, an absolute path, a symlink out)
        did not come from here and must not make ``recover`` cut a file.
        """
        if not isinstance(name, str) or "/" in name or not name.endswith(".jsonl"):
            return None
        try:
            return workspace_path(self.folder, name, field="journal")
        except UnsafePath:
            return None

    def read(self, location: ArchiveLocation) -> dict[str, Any]:
        path = workspace_path(self.workspace, location.file, field="archive.file")
        with path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                if number == location.line:
                    data: dict[str, Any] = json.loads(line)
                    return data
        raise KeyError(f"{location.file} has no line {location.line}")

    def iter_records(self) -> list[tuple[ArchiveLocation, dict[str, Any]]]:
        out: list[tuple[ArchiveLocation, dict[str, Any]]] = []
        if not self.folder.is_dir():
            return out
        for path in sorted(self.folder.glob("*.jsonl")):
            with path.open(encoding="utf-8") as fh:
                for number, line in enumerate(fh, start=1):
                    if line.strip():
                        out.append((ArchiveLocation(f"{self.folder_name}/{path.name}", number), json.loads(line)))
        return out
