"""Workspace files and single messages, for the owner only.

Files are served as plain text, never as HTML: a tool output holding a page
and a script stays text in every browser (nosniff, and a sandbox CSP for good
measure). A path that resolves outside the session's workspace (``..``, an
absolute path, a symlink pointing out) is a 404, like a missing file.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from contextlab.dashboard import fragments, review
from contextlab.dashboard.views.common import AuthenticatedHttpRequest, session_for_user
from contextlab.lib import textsafe
from contextlab.lib.blocks import first_text
from contextlab.sessions.models import AgentSession, SessionMessage

TEXT = "text/plain; charset=utf-8"


def workspace_file(session: AgentSession, relative: str) -> Path:
    """The file ``relative`` inside the session's workspace; Http404 for anything else."""
    target = session.workspace_file(relative)
    if target is None or not target.is_file():
        raise Http404("No such file")
    return target


def read_line(path: Path, number: int) -> str | None:
    """Line ``number`` (from 1) of a text file, without its newline; None past the end."""
    with path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
        for index, line in enumerate(fh, start=1):
            if index == number:
                return line.rstrip("\r\n")
    return None


def _plain(body: str | bytes, filename: str) -> HttpResponse:
    response = HttpResponse(body, content_type=TEXT)
    _harden(response, filename)
    return response


def _harden(response: HttpResponse | FileResponse, filename: str) -> None:
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "sandbox; default-src 'none'"
    safe_name = "".join(c if c.isalnum() or c in "._-" else "_" for c in filename) or "file.txt"
    response["Content-Disposition"] = f'inline; filename="{safe_name}"'


@require_GET
@login_required
def session_file(request: AuthenticatedHttpRequest, session_id: UUID, path: str) -> HttpResponse | FileResponse:
    session = session_for_user(request, session_id)
    target = workspace_file(session, path)
    line = request.GET.get("line", "")
    if line.isdigit() and int(line) > 0:
        text = read_line(target, int(line))
        if text is None:
            raise Http404("No such line")
        # An archive record: one JSON message per line, shown readable.
        with contextlib.suppress(ValueError):
            text = json.dumps(json.loads(text), ensure_ascii=False, indent=2)
        return _plain(f"{path}, line {line}\n\n{text}\n", target.name)
    response = FileResponse(target.open("rb"), content_type=TEXT)
    _harden(response, target.name)
    return response


def _blocks(blocks: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Content blocks as (label, preview) rows, for the message page."""
    rows = []
    for block in blocks or []:
        kind = str(block.get("type", ""))
        label = {"tool_use": f"tool call {block.get('name', '')}",
                 "tool_result": f"tool result {block.get('name', '')}" + (" (error)" if block.get("is_error") else ""),
                 }.get(kind, kind)
        rows.append({"kind": kind, "label": label, "preview": textsafe.preview(first_text([block]),
                                                                               head_lines=40, head_chars=6_000,
                                                                               max_chars=200_000)})
    return rows


@require_GET
@login_required
def message_detail(request: AuthenticatedHttpRequest, session_id: UUID, seq: int) -> HttpResponse:
    session = session_for_user(request, session_id)
    message = SessionMessage.objects.filter(session=session, seq=seq).first()
    if message is None:
        raise Http404("No such message")
    archived: dict[str, Any] | None = None
    if message.archive_file and message.archive_line:
        try:
            raw = read_line(workspace_file(session, message.archive_file), message.archive_line)
            record = json.loads(raw) if raw else None
        except (Http404, ValueError, OSError):
            record = None
        archived = {"file": message.archive_file, "line": message.archive_line,
                    "found": record is not None,
                    "blocks": _blocks(record.get("content") if isinstance(record, dict) else None)}
    row = fragments.fate_rows(session, [message])[0]
    return render(request, "sessions/message.html", {
        "session": session, "message": message, "events": row["events"],
        "original": _blocks(message.content), "current": _blocks(message.current_content),
        "same_content": message.content == message.current_content, "archived": archived,
        "files": list(session.offloaded_files.filter(message_id=message.message_id)),
        "previous": seq - 1 if seq > 1 else None,
        "next": seq + 1 if seq < session.messages_count else None,
        **review.pin_state(session, message),
    })
