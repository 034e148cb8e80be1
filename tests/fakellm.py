"""A real HTTP server speaking OpenAI chat completions, scripted per test.

It binds 127.0.0.1 on a free port and answers ``POST …/chat/completions``
with the next scripted step; the last step repeats when the script runs out.
Every request is recorded (path, headers, JSON body) so a test can assert what
the client really sent over the wire.

    with FakeLLM([Reply("## Goal ..."), Status(500)]) as llm:
        client = OpenAICompactor(llm.base_url, "fake-model", api_key_env=None)
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_USAGE = {"prompt_tokens": 321, "completion_tokens": 54, "total_tokens": 375}


@dataclass
class Reply:
    """A 200 answer whose message content is ``content`` (None sends ``null``)."""

    content: str | None
    usage: dict[str, int] | None = field(default_factory=lambda: dict(DEFAULT_USAGE))
    model: str = "fake-model-2026"
    finish_reason: str = "stop"


@dataclass
class Status:
    """An HTTP error with an OpenAI-style error body."""

    code: int
    message: str = "scripted failure"


@dataclass
class Sleep:
    """Wait ``seconds`` before answering with ``then`` (longer than the client's timeout)."""

    seconds: float
    then: Reply | Status | None = None


@dataclass
class Gate:
    """Hold the answer until the test opens ``opened`` (a summary call as slow as the test needs),
    and tell the test the request ``arrived``."""

    then: Reply
    arrived: threading.Event = field(default_factory=threading.Event)
    opened: threading.Event = field(default_factory=threading.Event)


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: bytes = b""  # the body's bytes as received

    @property
    def user_text(self) -> str:
        return "\n".join(m["content"] for m in self.body.get("messages", []) if m.get("role") == "user")

    @property
    def system_text(self) -> str:
        return "\n".join(m["content"] for m in self.body.get("messages", []) if m.get("role") == "system")


class FakeLLM:
    def __init__(self, script: list[Reply | Status | Sleep | Gate], *, port: int = 0) -> None:
        if not script:
            raise ValueError("a FakeLLM needs at least one scripted step")
        self.script = list(script)
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self._server.daemon_threads = True
        # A short poll interval: shutdown() waits for it, once per test.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    @property
    def provider(self) -> dict[str, dict[str, str]]:
        """A CONTEXTLAB_PROVIDERS value offering this server as the provider "fake"."""
        return {"fake": {"base_url": self.base_url, "api_key_env": ""}}

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> FakeLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # Wake handlers still sleeping so the port is released promptly.
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _next_step(self, body: dict[str, Any], path: str, headers: dict[str, str]) -> Reply | Status | Sleep | Gate:
        with self._lock:
            self.requests.append(Recorded(path, headers, body))
            index = len(self.requests) - 1
            return self.script[min(index, len(self.script) - 1)]

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_unparsable": raw.decode("utf-8", "replace")}
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                    return
                step = fake._next_step(body, self.path, {k.lower(): v for k, v in self.headers.items()})
                if isinstance(step, Sleep):
                    if fake._stopping.wait(step.seconds):
                        return
                    step = step.then or Reply("## Goal\n- late")
                elif isinstance(step, Gate):
                    step.arrived.set()
                    while not step.opened.wait(0.05):
                        if fake._stopping.is_set():
                            return
                    step = step.then
                try:
                    if isinstance(step, Status):
                        self._send(
                            step.code,
                            {"error": {"message": step.message, "type": "scripted", "code": str(step.code)}},
                        )
                    else:
                        self._send(200, _completion(step, body))
                except (BrokenPipeError, ConnectionResetError):
                    # The client gave up (timeout) before the answer came.
                    pass

            def _send(self, code: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode("utf-8")
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _completion(step: Reply, request: dict[str, Any]) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "id": "chatcmpl-fake-1",
        "object": "chat.completion",
        "created": 1_774_000_000,
        "model": step.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": step.content},
                "finish_reason": step.finish_reason,
            }
        ],
    }
    if step.usage is not None:
        payload["usage"] = step.usage
    return payload
