"""Tool-result truncation of the ``contextlab`` policy, and the offload store.

The notice keeps CoPaw's wording, because CoPaw agents parse it, but its numbers
are true: "covers the next N bytes" is the number of bytes actually kept, the cut
lands on a line boundary when the excerpt has one (else on a character
boundary, never inside a UTF-8 sequence), and a single long line still gets a
notice that says at which byte offset the rest starts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from contextlab.engine.core.paths import workspace_path

MARKER = "<<<TRUNCATED>>>"


@dataclass(frozen=True)
class Cut:
    """The result of cutting one text."""

    text: str  # excerpt plus notice, what the model sees
    kept_bytes: int
    original_bytes: int
    next_line: int  # first line not (fully) in the excerpt
    next_byte: int  # byte offset in the original where the unread part starts
    total_lines: int
    boundary: str  # "line" or "character"


def count_lines(text: str) -> int:
    """Lines as a person counts them: a trailing newline does not start a new line."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def utf8_prefix(data: bytes, limit: int) -> bytes:
    """The longest prefix of at most ``limit`` bytes that ends on a character boundary."""
    if limit >= len(data):
        return data
    end = limit
    # Step back over continuation bytes (10xxxxxx) to the lead byte of the
    # character that straddles the limit, and cut before it.
    while end > 0 and (data[end] & 0xC0) == 0x80:
        end -= 1
    return data[:end]


def cut_text(
    text: str,
    *,
    max_bytes: int,
    file_path: str,
    start_line: int = 1,
    total_lines: int | None = None,
    byte_offset: int = 0,
) -> Cut:
    """Cut ``text`` to at most ``max_bytes`` bytes of excerpt and append the notice.

    ``start_line`` and ``byte_offset`` say where ``text`` itself starts inside the
    file the notice points to (read_file results start mid-file).
    """
    raw = text.encode("utf-8")
    lines_total = total_lines if total_lines is not None else start_line - 1 + count_lines(text)
    prefix = utf8_prefix(raw, max(0, max_bytes))
    boundary = "character"
    last_newline = prefix.rfind(b"\n")
    # Back up to the last line break, unless that throws away more than half
    # of the excerpt (one short line before a very long one): then cut the long
    # line at a character boundary and say where it continues.
    if len(prefix) < len(raw) and last_newline >= 0 and (last_newline + 1) * 2 >= len(prefix):
        prefix = prefix[: last_newline + 1]
        boundary = "line"
    kept = prefix.decode("utf-8")
    complete_lines = kept.count("\n")
    next_line = start_line + complete_lines
    next_byte = byte_offset + len(prefix)
    notice = [
        "The output above was truncated.",
        f"The full content is saved to the file and contains {lines_total} lines in total.",
        f"This excerpt starts at line {start_line} and covers the next {len(prefix)} bytes.",
    ]
    if boundary == "character":
        notice.append(
            f"Line {next_line} is longer than the excerpt: it continues at byte offset {next_byte} of the file."
        )
    notice.append(
        f"If the current content is not enough, call `read_file` with file_path={file_path} "
        f"start_line={next_line} to read more."
    )
    separator = "" if kept.endswith("\n") or not kept else "\n"
    return Cut(
        text=kept + separator + MARKER + "\n" + "\n".join(notice),
        kept_bytes=len(prefix),
        original_bytes=len(raw),
        next_line=next_line,
        next_byte=next_byte,
        total_lines=lines_total,
        boundary=boundary,
    )


def reference_only(*, file_path: str, total_lines: int, original_bytes: int, start_line: int = 1) -> str:
    """What an old browser-type result becomes: no excerpt, only the way back."""
    return "\n".join(
        [
            MARKER,
            "The output was removed from the context to save space.",
            f"The full content is saved to the file and contains {total_lines} lines in total "
            f"({original_bytes} bytes).",
            "This excerpt starts at line 1 and covers the next 0 bytes.",
            f"If you need it, call `read_file` with file_path={file_path} start_line={start_line} to read more.",
        ]
    )


@dataclass(frozen=True)
class OffloadedFile:
    path: Path  # absolute
    relative: str  # relative to the workspace, what notices and records name
    bytes: int
    sha256: str


def content_file_name(text: str) -> str:
    """A file name for an offloaded output, derived from its content.

    Shaped like a uuid4 hex (32 hex digits) but deterministic, so two identical
    replays name the same files and their notices cost the same tokens.
    """
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


class OffloadStore:
    """Full tool outputs under ``<workspace>/tool_result/<name>.txt``.

    ``name`` defaults to :func:`content_file_name`; the same text saved twice
    is one file.

    Files are written atomically (temp file, then rename) so a crash never
    leaves a half-written original that a notice points to.
    """

    folder_name = "tool_result"

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.folder = workspace / self.folder_name

    def save(self, text: str, *, name: str | None = None) -> OffloadedFile:
        self.folder.mkdir(parents=True, exist_ok=True)
        data = text.encode("utf-8")
        file_name = f"{name or content_file_name(text)}.txt"
        target = self.folder / file_name
        if not target.exists():
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, target)
        return OffloadedFile(
            path=target,
            relative=f"{self.folder_name}/{file_name}",
            bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )

    def read(self, relative: str) -> str:
        # Bytes, not read_text: universal-newline decoding would turn the
        # original's \r\n into \n and the "original" would no longer be it.
        return self.resolve(relative).read_bytes().decode("utf-8")

    def resolve(self, relative: str) -> Path:
        """The absolute path of a workspace-relative name; never outside the workspace."""
        return workspace_path(self.workspace, relative, field="offload.file")

    def cleanup_expired(
        self, *, retention_days: int, referenced: set[str], now: dt.datetime | None = None
    ) -> list[str]:
        """Delete offloaded files older than the retention period.

        A file still referenced by the live context is never deleted, whatever
        its age: the notice in the context would point to nothing.
        """
        if not self.folder.is_dir():
            return []
        moment = now or dt.datetime.now(dt.UTC)
        cutoff = moment.timestamp() - retention_days * 86_400
        removed: list[str] = []
        for path in sorted(self.folder.glob("*.txt")):
            relative = f"{self.folder_name}/{path.name}"
            if relative in referenced:
                continue
            if path.stat().st_mtime < cutoff:
                path.unlink(missing_ok=True)
                removed.append(relative)
        return removed
