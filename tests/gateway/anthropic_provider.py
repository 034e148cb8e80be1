"""A scripted Anthropic Messages API on 127.0.0.1 (stdlib HTTP server, real sockets, real SSE).

Only the model is scripted: a ``brain`` takes each request body and answers with
content blocks; the server speaks the wire protocol for real (``message`` JSON,
or the event stream with ``message_start``, ``content_block_*``, ``ping``,
``message_delta``, ``message_stop``), written event by event with TCP_NODELAY so
a client sees each one as it is sent. Every request is kept (path, headers,
body) for the tests to check what crossed the wire.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Answer:
    blocks: list[dict[str, Any]]
    stop_reason: str = "end_turn"
    usage: dict[str, Any] = field(default_factory=lambda: {
        "input_tokens": 1200, "cache_read_input_tokens": 800, "cache_creation_input_tokens": 100,
        "output_tokens": 25})
    # Stream only: stop after this many events without message_stop (a cut stream).
    cut_after: int | None = None
    # Stream only: seconds between events.
    event_delay: float = 0.0
    context_management: dict[str, Any] | None = None


def text(value: str, **kwargs: Any) -> Answer:
    return Answer([{"type": "text", "text": value}], **kwargs)


def tool_use(name: str, arguments: dict[str, Any], call_id: str, *, thinking: str = "") -> Answer:
    blocks: list[dict[str, Any]] = []
    if thinking:
        blocks.append({"type": "thinking", "thinking": thinking, "signature": f"sig-{call_id}"})
    blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
    return Answer(blocks, stop_reason="tool_use")


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


def last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def last_tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages") or []
    if not messages or messages[-1].get("role") != "user" or not isinstance(messages[-1].get("content"), list):
        return []
    return [b for b in messages[-1]["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]


class AnthropicProvider:
    def __init__(self, brain: Callable[[dict[str, Any]], Answer] | None = None) -> None:
        self.brain: Callable[[dict[str, Any]], Answer] = brain or (lambda body: text("hello"))
        self.received: list[Received] = []
        self.count_tokens_answer = {"input_tokens": 4321}
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.loads(raw)
                with owner._lock:
                    owner.received.append(Received(self.path, dict(self.headers), body))
                if self.path.split("?")[0].endswith("/count_tokens"):
                    self._json(200, owner.count_tokens_answer)
                    return
                if self.headers.get("x-api-key") is None and self.headers.get("authorization") is None:
                    self._json(401, {"type": "error", "error": {"type": "authentication_error",
                                                                "message": "no key"}})
                    return
                answer = owner.brain(body)
                message = {"id": f"msg_{len(owner.received):04d}", "type": "message", "role": "assistant",
                           "model": body.get("model"), "content": answer.blocks, "stop_reason": answer.stop_reason,
                           "stop_sequence": None, "usage": answer.usage}
                if answer.context_management is not None:
                    message["context_management"] = answer.context_management
                if body.get("stream"):
                    self._stream(message, answer)
                else:
                    self._json(200, message)

            def _json(self, status: int, data: Any) -> None:
                out = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("request-id", "req_scripted")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def _stream(self, message: dict[str, Any], answer: Answer) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("request-id", "req_scripted")
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True
                events = _events(message)
                for number, (kind, data) in enumerate(events):
                    if answer.cut_after is not None and number >= answer.cut_after:
                        return
                    if answer.event_delay and number:
                        time.sleep(answer.event_delay)
                    self.wfile.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())
                    self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @property
    def messages_requests(self) -> list[Received]:
        return [r for r in self.received if r.path.split("?")[0].endswith("/messages")]

    def __enter__(self) -> AnthropicProvider:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    start = {**message, "content": [], "stop_reason": None,
             "usage": {**message["usage"], "output_tokens": 1}}
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start}),
                                                ("ping", {"type": "ping"})]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "text":
            events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": {"type": "text", "text": ""}}))
            middle = len(block["text"]) // 2
            for piece in (block["text"][:middle], block["text"][middle:]):
                events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                       "delta": {"type": "text_delta", "text": piece}}))
        elif kind == "thinking":
            events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": {"type": "thinking", "thinking": ""}}))
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                   "delta": {"type": "thinking_delta", "thinking": block["thinking"]}}))
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                   "delta": {"type": "signature_delta",
                                                             "signature": block["signature"]}}))
        elif kind == "tool_use":
            events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": {
                "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}))
            arguments = json.dumps(block["input"])
            for piece in (arguments[:5], arguments[5:]):
                events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                       "delta": {"type": "input_json_delta", "partial_json": piece}}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta: dict[str, Any] = {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"],
                                                                "stop_sequence": None},
                             "usage": {"output_tokens": message["usage"].get("output_tokens", 0)}}
    if "context_management" in message:
        delta["context_management"] = message["context_management"]
    events.append(("message_delta", delta))
    events.append(("message_stop", {"type": "message_stop"}))
    return events
