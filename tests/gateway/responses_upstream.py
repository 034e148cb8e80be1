"""A scripted OpenAI Responses API provider for the gateway tests: a real HTTP server on 127.0.0.1.

Only the model is scripted: every request is recorded (path, headers, body) and
answered by the responder with output items, as JSON or as the server-sent
events the real API streams (``response.created`` … ``response.completed``),
each event flushed on its own (TCP_NODELAY), so a relay that buffers shows.

    with ResponsesUpstream(lambda request: Reply([text("hi")])) as upstream:
        OpenAI(base_url=upstream.base_url, api_key="x").responses.create(model="m", input="hello")
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: bytes = b""


@dataclass
class Reply:
    """A 200 answer: these output items, this usage."""

    output: list[dict[str, Any]]
    input_tokens: int = 300
    output_tokens: int = 40
    # Streamed: drop the connection after this many events (a provider that crashes mid-answer).
    break_after: int | None = None
    # Seconds between two streamed events.
    pause: float = 0.0


@dataclass
class Failure:
    status: int
    body: bytes = b'{"error": {"message": "scripted failure", "type": "server_error", "param": null, "code": "x"}}'


Step = Reply | Failure
Responder = Callable[[Request], Step]

_ids = itertools.count(1)


def _id(prefix: str) -> str:
    return f"{prefix}_{next(_ids):06d}"


def text(value: str) -> dict[str, Any]:
    return {"type": "message", "id": _id("msg"), "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": value, "annotations": []}]}


def function_call(name: str, arguments: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    return {"type": "function_call", "id": _id("fc"), "status": "completed", "name": name,
            "arguments": json.dumps(arguments), "call_id": call_id or _id("call")}


def reasoning(summary: str = "thinking") -> dict[str, Any]:
    return {"type": "reasoning", "id": _id("rs"), "summary": [{"type": "summary_text", "text": summary}],
            "encrypted_content": "gAAAAB" + "x" * 40}


def compaction(secret: str = "opaque-summary") -> dict[str, Any]:
    return {"type": "compaction", "id": _id("cmp"), "encrypted_content": "gAAAAB" + secret.encode().hex()}


def scripted(*steps: Step) -> Responder:
    """The n-th request gets the n-th step; the last one repeats."""
    counter = itertools.count()

    def respond(request: Request) -> Step:
        return steps[min(next(counter), len(steps) - 1)]

    return respond


def response_object(request: Request, reply: Reply, response_id: str, *, status: str = "completed") -> dict[str, Any]:
    body = request.body
    done = status == "completed"
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()), "status": status,
        "model": body.get("model", "fake-model"), "output": reply.output if done else [],
        "parallel_tool_calls": True, "previous_response_id": body.get("previous_response_id"),
        "store": body.get("store", True), "tools": body.get("tools", []), "tool_choice": "auto",
        "instructions": body.get("instructions"), "error": None, "incomplete_details": None,
        "metadata": {}, "temperature": 1.0, "top_p": 1.0, "text": {"format": {"type": "text"}},
        "truncation": "disabled", "reasoning": {"effort": None, "summary": None},
        "usage": {"input_tokens": reply.input_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": reply.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": reply.input_tokens + reply.output_tokens} if done else None,
    }


def events(request: Request, reply: Reply, response_id: str) -> Iterator[dict[str, Any]]:
    """The events of one streamed response, in the order the real API sends them."""
    seq = itertools.count()
    yield {"type": "response.created", "sequence_number": next(seq),
           "response": response_object(request, reply, response_id, status="in_progress")}
    yield {"type": "response.in_progress", "sequence_number": next(seq),
           "response": response_object(request, reply, response_id, status="in_progress")}
    for index, item in enumerate(reply.output):
        if item["type"] == "message":
            yield {"type": "response.output_item.added", "sequence_number": next(seq), "output_index": index,
                   "item": {**item, "status": "in_progress", "content": []}}
            part = item["content"][0]
            yield {"type": "response.content_part.added", "sequence_number": next(seq), "output_index": index,
                   "item_id": item["id"], "content_index": 0, "part": {**part, "text": ""}}
            words = part["text"].split(" ")
            for position, word in enumerate(words):
                yield {"type": "response.output_text.delta", "sequence_number": next(seq), "output_index": index,
                       "item_id": item["id"], "content_index": 0,
                       "delta": word if position == 0 else " " + word, "logprobs": []}
            yield {"type": "response.output_text.done", "sequence_number": next(seq), "output_index": index,
                   "item_id": item["id"], "content_index": 0, "text": part["text"], "logprobs": []}
            yield {"type": "response.content_part.done", "sequence_number": next(seq), "output_index": index,
                   "item_id": item["id"], "content_index": 0, "part": part}
        elif item["type"] == "function_call":
            yield {"type": "response.output_item.added", "sequence_number": next(seq), "output_index": index,
                   "item": {**item, "status": "in_progress", "arguments": ""}}
            yield {"type": "response.function_call_arguments.delta", "sequence_number": next(seq),
                   "output_index": index, "item_id": item["id"], "delta": item["arguments"]}
            yield {"type": "response.function_call_arguments.done", "sequence_number": next(seq),
                   "output_index": index, "item_id": item["id"], "arguments": item["arguments"]}
        else:
            yield {"type": "response.output_item.added", "sequence_number": next(seq), "output_index": index,
                   "item": item}
        yield {"type": "response.output_item.done", "sequence_number": next(seq), "output_index": index,
               "item": item}
    yield {"type": "response.completed", "sequence_number": next(seq),
           "response": response_object(request, reply, response_id)}


class ResponsesUpstream:
    """The server; ``requests`` holds every call, ``responder`` decides each answer."""

    def __init__(self, responder: Responder | None = None) -> None:
        self.responder: Responder = responder or (lambda request: Reply([text("ok")]))
        self.requests: list[Request] = []
        self.response_ids: list[str] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def posts(self) -> list[Request]:
        return [r for r in self.requests if r.method == "POST"]

    def __enter__(self) -> ResponsesUpstream:
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self) -> None:
                # A WebSocket upgrade attempt: this server speaks HTTP only.
                with upstream._lock:
                    upstream.requests.append(Request("GET", self.path, dict(self.headers.items()), {}))
                self._json(426, b'{"error": {"message": "use HTTP", "type": "invalid_request_error"}}')

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"unparsed": raw.decode("utf-8", "replace")}
                request = Request("POST", self.path, dict(self.headers.items()), body, raw)
                with upstream._lock:
                    upstream.requests.append(request)
                    step = upstream.responder(request)
                    response_id = _id("resp")
                    upstream.response_ids.append(response_id)
                if isinstance(step, Failure):
                    self._json(step.status, step.body)
                    return
                if not body.get("stream"):
                    self._json(200, json.dumps(response_object(request, step, response_id)).encode())
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("x-request-id", "req_" + response_id)
                self.end_headers()
                for number, event in enumerate(events(request, step, response_id)):
                    if step.break_after is not None and number >= step.break_after:
                        # Cut mid-body: no terminating chunk, the connection just goes.
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    data = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                    if step.pause:
                        time.sleep(step.pause)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _json(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
