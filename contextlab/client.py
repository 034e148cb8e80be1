"""A small client for ContextLab's JSON API, for agents that run elsewhere.

Standard library only, so an agent can vendor this one file::

    from contextlab.client import ContextLabClient

    cl = ContextLabClient("http://127.0.0.1:8000", token)
    session = cl.create_session("You are a coding agent.")
    cl.add_messages(session["id"], [{"role": "user", "content": "Fix the build"}])
    turn = cl.prepare(session["id"])          # the hook ran on the server
    reply = my_llm(turn.messages)             # send exactly these messages
    cl.report_usage(session["id"], turn.turn, reply.usage)

Every 4xx/5xx answer raises ``ApiError`` carrying the server's ``error`` and
``field``, so a bad message says which message and which part.
"""

from __future__ import annotations

import json
import mimetypes
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ApiError(Exception):
    """The server refused a request; ``field`` names what was wrong, when it knows."""

    def __init__(self, status: int, error: str, field: str | None = None, kind: str | None = None) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.field = field
        self.kind = kind

    def __str__(self) -> str:
        where = f" (field: {self.field})" if self.field else ""
        return f"HTTP {self.status}: {self.error}{where}"


@dataclass(frozen=True)
class PreparedTurn:
    """What ``prepare`` returns: the exact messages to send, and why they are what they are."""

    turn: int
    messages: list[dict[str, Any]]
    trace: dict[str, Any]

    @property
    def outcome(self) -> str:
        return str(self.trace.get("outcome", ""))

    @property
    def payload_tokens(self) -> int:
        return int(((self.trace.get("payload") or {}).get("tokens") or {}).get("total", 0))

    @property
    def compacted(self) -> bool:
        return self.outcome in ("compacted", "fallback_summary")


class ContextLabClient:
    def __init__(self, base_url: str, token: str, *, timeout: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/api/v1"):
            self.base_url += "/api/v1"
        self.token = token
        self.timeout = timeout

    # -- sessions --------------------------------------------------------------------
    def create_session(self, system_prompt: str, *, profile: int | str | dict[str, Any] | None = None,
                       title: str = "") -> dict[str, Any]:
        """Create a session; ``profile`` is a profile id, a name, or settings for a new profile."""
        body: dict[str, Any] = {"system_prompt": system_prompt, "title": title}
        if profile is not None:
            body["profile"] = profile
        return self._json("POST", "/sessions", body)

    def sessions(self, *, limit: int = 50, offset: int = 0) -> list[dict[str, Any]]:
        data = self._json("GET", f"/sessions?limit={limit}&offset={offset}")
        return list(data["sessions"])

    def session(self, session_id: str) -> dict[str, Any]:
        return self._json("GET", f"/sessions/{session_id}")

    def add_messages(self, session_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """Append OpenAI, Anthropic or AgentScope messages (the server detects which)."""
        return self._json("POST", f"/sessions/{session_id}/messages", {"messages": messages})

    def prepare(self, session_id: str) -> PreparedTurn:
        """Run the pre-reasoning hook; send ``.messages`` to the LLM as they are."""
        data = self._json("POST", f"/sessions/{session_id}/prepare", {})
        return PreparedTurn(turn=int(data["turn"]), messages=list(data["messages"]), trace=dict(data["trace"]))

    def report_usage(self, session_id: str, turn: int, usage: dict[str, Any]) -> dict[str, Any]:
        """Tell the server what the provider billed for the call made with ``turn``'s messages."""
        return self._json("POST", f"/sessions/{session_id}/usage", {"turn": turn, "usage": usage})

    def compact(self, session_id: str, instruction: str | None = None, *, preview: bool = False) -> dict[str, Any]:
        """Manual compaction (``/compact [instruction]``), or with ``preview`` only the planned split."""
        return self._json("POST", f"/sessions/{session_id}/compact",
                          {"instruction": instruction, "preview": preview})

    # -- compaction as a review ----------------------------------------------------------
    def dry_run(self, session_id: str, instruction: str | None = None) -> dict[str, Any]:
        """Start a dry run with the profile's compactor; returns the run (poll ``run`` for its draft)."""
        return dict(self._json("POST", f"/sessions/{session_id}/dry-runs", {"instruction": instruction})["run"])

    def run(self, session_id: str, run_id: int) -> dict[str, Any]:
        """A compaction, import or dry run; a dry run's ``draft`` once its status is "draft"."""
        return self._json("GET", f"/sessions/{session_id}/runs/{run_id}")

    def wait_for_run(self, session_id: str, run_id: int, *, timeout: float = 120.0,
                     interval: float = 0.5) -> dict[str, Any]:
        """Poll a run until it is no longer queued or running."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.run(session_id, run_id)
            if run["status"] not in ("queued", "running") or time.monotonic() > deadline:
                return run
            time.sleep(interval)

    def accept_draft(self, session_id: str, run_id: int) -> dict[str, Any]:
        """Commit exactly the reviewed draft; ``ApiError`` 409 when it is stale (run a new dry run)."""
        return self._json("POST", f"/sessions/{session_id}/runs/{run_id}/accept", {})

    def discard_draft(self, session_id: str, run_id: int) -> dict[str, Any]:
        return self._json("POST", f"/sessions/{session_id}/runs/{run_id}/discard", {})

    def cancel_run(self, session_id: str, run_id: int) -> dict[str, Any]:
        """Cancel a queued or running compaction or dry run; nothing of it is committed."""
        return self._json("POST", f"/sessions/{session_id}/runs/{run_id}/cancel", {})

    def pins(self, session_id: str) -> dict[str, Any]:
        return self._json("GET", f"/sessions/{session_id}/pins")

    def pin(self, session_id: str, *, message_id: str | None = None, fact: str | None = None,
            remove: bool = False) -> dict[str, Any]:
        """Pin (or with ``remove`` unpin) a live message or a fact for the coming compactions."""
        if (message_id is None) == (fact is None):
            raise ValueError("give exactly one of message_id and fact")
        kind = "message" if message_id is not None else "fact"
        body: dict[str, Any] = {"action": f"{'unpin' if remove else 'pin'}_{kind}"}
        body["message_id" if message_id is not None else "fact"] = message_id if message_id is not None else fact
        return self._json("POST", f"/sessions/{session_id}/pins", body)

    def turns(self, session_id: str, *, after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        data = self._json("GET", f"/sessions/{session_id}/turns?after={after}&limit={limit}")
        return list(data["turns"])

    def turn(self, session_id: str, number: int) -> dict[str, Any]:
        return self._json("GET", f"/sessions/{session_id}/turns/{number}")

    def summaries(self, session_id: str) -> list[dict[str, Any]]:
        return list(self._json("GET", f"/sessions/{session_id}/summaries")["summaries"])

    def import_transcript(self, path: str | Path, *, profile: int | str | None = None,
                          title: str = "") -> dict[str, Any]:
        """Upload a recorded transcript (or a session bundle) to be replayed into a new session."""
        file_path = Path(path)
        fields = {"title": title}
        if profile is not None:
            fields["profile"] = str(profile)
        body, content_type = _multipart(fields, "file", file_path.name, file_path.read_bytes())
        return self._request("POST", "/imports", body, content_type)

    # -- plumbing --------------------------------------------------------------------
    def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        return self._request(method, path, data, "application/json")

    def _request(self, method: str, path: str, data: bytes | None, content_type: str) -> dict[str, Any]:
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                result: dict[str, Any] = json.loads(response.read().decode("utf-8"))
                return result
        except urllib.error.HTTPError as exc:
            raise _api_error(exc) from None


def _api_error(exc: urllib.error.HTTPError) -> ApiError:
    raw = exc.read()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return ApiError(exc.code, raw.decode("utf-8", "replace")[:500] or str(exc.reason))
    if not isinstance(data, dict):
        return ApiError(exc.code, str(data)[:500])
    return ApiError(exc.code, str(data.get("error") or exc.reason), data.get("field"), data.get("kind"))


def _multipart(fields: dict[str, str], file_field: str, file_name: str, content: bytes) -> tuple[bytes, str]:
    boundary = f"contextlab-{uuid.uuid4().hex}"
    parts: list[bytes] = []
    for name, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    mime = mimetypes.guess_type(file_name)[0] or "application/octet-stream"
    safe_name = urllib.parse.quote(file_name)
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{file_field}"; filename="{safe_name}"\r\n'
                 f"Content-Type: {mime}\r\n\r\n".encode() + content + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"
