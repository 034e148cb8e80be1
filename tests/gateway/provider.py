"""A local OpenAI-compatible provider for the gateway tests and the latency benchmark.

Like ``tests.fakellm.FakeLLM`` (a real HTTP server on 127.0.0.1, every request
recorded), plus what a gateway needs from a provider: tool calls, streaming
(server-sent events over chunked transfer encoding, with the usage chunk only
when ``stream_options.include_usage`` asks for it), ``GET /models``, and error
answers whose exact bytes a test can compare.

    with Provider(lambda body: Answer("hi")) as provider:
        OpenAI(base_url=provider.base_url, api_key="x").chat.completions.create(...)
        provider.requests[-1].body["messages"]
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.fakellm import Recorded

USAGE = {"prompt_tokens": 321, "completion_tokens": 54, "total_tokens": 375}
MODELS = {"object": "list", "data": [
    {"id": "fake-model-2026", "object": "model", "created": 1_774_000_000, "owned_by": "tests"},
    {"id": "fake-mini", "object": "model", "created": 1_774_000_000, "owned_by": "tests"},
]}


@dataclass
class Answer:
    """A 200 completion: text, tool calls (name, arguments), or both."""

    content: str | None = "ok"
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    usage: dict[str, int] | None = field(default_factory=lambda: dict(USAGE))
    model: str = "fake-model-2026"
    # Seconds to wait before answering at all, and before each streamed event after the first.
    delay: float = 0.0
    chunk_delay: float = 0.0
    # Streamed: drop the connection after this many events, mid-body (a provider that crashes).
    break_after: int | None = None


@dataclass
class Error:
    """A non-200 answer sent byte for byte."""

    status: int
    body: bytes = b'{"error": {"message": "scripted failure", "type": "scripted", "param": null, "code": "x"}}'
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})


Step = Answer | Error
Responder = Callable[[dict[str, Any]], Step]


def scripted(*steps: Step) -> Responder:
    """Answer the n-th request with the n-th step; the last one repeats."""
    counter = itertools.count()

    def respond(body: dict[str, Any]) -> Step:
        return steps[min(next(counter), len(steps) - 1)]

    return respond


def tool_loop(tool: str = "run_shell", *, rounds: int = 1, final: str = "All done.") -> Responder:
    """An agent brain: after each user message call ``tool`` ``rounds`` times, then answer."""

    def respond(body: dict[str, Any]) -> Step:
        messages = body.get("messages") or []
        calls_since_user = 0
        for message in reversed(messages):
            if message.get("role") == "user" and message.get("name") != "summary":
                break
            if message.get("role") == "assistant" and message.get("tool_calls"):
                calls_since_user += 1
        if calls_since_user < rounds:
            return Answer(content=None, tool_calls=[(tool, {"command": f"make step{calls_since_user + 1}"})])
        return Answer(final)

    return respond


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients closing idle keep-alive connections is normal, not worth a traceback.
        pass


class Provider:
    def __init__(self, responder: Responder | None = None) -> None:
        self.responder: Responder = responder or (lambda body: Answer())
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        # Set on exit, so handlers still waiting give up and the port is released promptly.
        self._stopping = threading.Event()
        self._server = _Server(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> Provider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def chat_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def _record(self, path: str, headers: dict[str, str], body: dict[str, Any], raw: bytes = b"") -> int:
        with self._lock:
            self.requests.append(Recorded(path, headers, body, raw))
            return next(self._ids)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in separate writes; with Nagle's algorithm
            # the second waits for a delayed ACK (~40 ms), which would swamp
            # any latency measured against this server.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                provider._record(self.path, {k.lower(): v for k, v in self.headers.items()}, {})
                path = self.path.rstrip("/")
                if path.endswith("/models"):
                    self._json(200, MODELS)
                elif "/models/" in path:
                    name = path.rsplit("/", 1)[1]
                    found = [m for m in MODELS["data"] if m["id"] == name]
                    if found:
                        self._json(200, found[0])
                    else:
                        self._json(404, {"error": {"message": f"The model '{name}' does not exist",
                                                   "type": "invalid_request_error", "param": None,
                                                   "code": "model_not_found"}})
                else:
                    self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_unparsable": raw.decode("utf-8", "replace")}
                number = provider._record(self.path, {k.lower(): v for k, v in self.headers.items()}, body, raw)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                    return
                step = provider.responder(body)
                if isinstance(step, Answer) and step.delay and provider._stopping.wait(step.delay):
                    return
                try:
                    if isinstance(step, Error):
                        self._raw(step.status, step.body, step.headers)
                    elif body.get("stream"):
                        self._stream(step, body, number)
                    else:
                        self._json(200, completion(step, number))
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _json(self, status: int, payload: Any) -> None:
                self._raw(status, json.dumps(payload).encode(), {"Content-Type": "application/json",
                                                                  "x-request-id": "req-test"})

            def _raw(self, status: int, data: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, step: Answer, body: dict[str, Any], number: int) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("x-request-id", "req-test")
                self.end_headers()
                options = body.get("stream_options") or {}
                include_usage = isinstance(options, dict) and options.get("include_usage") is True
                for index, chunk in enumerate(stream_chunks(step, number, include_usage=include_usage)):
                    if index and step.chunk_delay and provider._stopping.wait(step.chunk_delay):
                        return
                    if step.break_after is not None and index == step.break_after:
                        # No terminating chunk: the client's read of the body fails.
                        self.close_connection = True
                        return
                    data = b"data: " + (chunk if isinstance(chunk, bytes) else json.dumps(chunk).encode()) + b"\n\n"
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        return Handler


def _calls(step: Answer, number: int) -> list[dict[str, Any]]:
    return [{"id": f"call_{number}_{i}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}
            for i, (name, args) in enumerate(step.tool_calls)]


def completion(step: Answer, number: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": step.content, "refusal": None, "annotations": []}
    if step.tool_calls:
        message["tool_calls"] = _calls(step, number)
    payload: dict[str, Any] = {
        "id": f"chatcmpl-{number}", "object": "chat.completion", "created": 1_774_000_000, "model": step.model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "tool_calls" if step.tool_calls else "stop"}],
        "system_fingerprint": "fp_test",
    }
    if step.usage is not None:
        payload["usage"] = step.usage
    return payload


def stream_chunks(step: Answer, number: int, *, include_usage: bool) -> list[dict[str, Any] | bytes]:
    """The chunks OpenAI streams for ``step``; with include_usage every chunk carries ``usage: null``."""
    base = {"id": f"chatcmpl-{number}", "object": "chat.completion.chunk", "created": 1_774_000_000,
            "model": step.model, "system_fingerprint": "fp_test"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        out = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            out["usage"] = None
        return out

    chunks: list[dict[str, Any] | bytes] = [chunk({"role": "assistant", "content": "", "refusal": None})]
    text = step.content or ""
    pieces = [text[i:i + 7] for i in range(0, len(text), 7)]
    chunks.extend(chunk({"content": piece}) for piece in pieces)
    for i, call in enumerate(_calls(step, number)):
        arguments = call["function"]["arguments"]
        chunks.append(chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                             "function": {"name": call["function"]["name"], "arguments": ""}}]}))
        for j in range(0, len(arguments), 5):
            chunks.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": arguments[j:j + 5]}}]}))
    chunks.append(chunk({}, "tool_calls" if step.tool_calls else "stop"))
    if include_usage and step.usage is not None:
        chunks.append({**base, "choices": [], "usage": step.usage})
    chunks.append(b"[DONE]")
    return chunks
