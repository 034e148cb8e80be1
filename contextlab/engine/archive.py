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

from contextlab.engine.messages import Message


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
    folder_name = "dialog"

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
    ) -> list[ArchiveLocation]:
        """Append messages (with extra fields per record); return where each landed."""
        self.folder.mkdir(parents=True, exist_ok=True)
        by_file: dict[str, list[tuple[int, str]]] = {}
        for position, (message, extra) in enumerate(records):
            data = serialise(message) if serialise else message.to_dict()
            data.update(extra)
            line = json.dumps(data, ensure_ascii=False)
            by_file.setdefault(f"{date_for(message)}.jsonl", []).append((position, line))
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

    def read(self, location: ArchiveLocation) -> dict[str, Any]:
        path = self.workspace / location.file
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
