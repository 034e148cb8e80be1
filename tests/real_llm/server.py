"""A real ``llama-server`` for the tests, and a recording proxy in front of it.

``LlamaServer`` starts llama.cpp's server on a free 127.0.0.1 port, waits for
its ``/health`` and stops it. ``RecordingProxy`` forwards every request to it
unchanged and keeps what crossed the wire (the request body the server
received, its answer, how long it took), so a test asserts on the real
exchange rather than on what the client believes it sent.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# Room for the summary prompt of a 4,000-token test profile: its transcript is
# capped at 60 % of the window in the engine's tokens, and the model's own
# tokenizer needs up to twice as many for build logs (4,882 measured). A bigger
# prompt gets the server's "exceeds the context size" answer; one test relies on it.
CONTEXT_TOKENS = 8192
# The server's own bound on a reply: a looping small model stops here, so one
# call takes seconds, not minutes. A request's max_tokens can only lower it.
PREDICT_TOKENS = 256
START_TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LlamaServer:
    """``llama-server`` serving one model on 127.0.0.1, started and stopped by the caller."""

    def __init__(self, binary: Path, model: Path, log_path: Path, *, context_tokens: int = CONTEXT_TOKENS,
                 predict_tokens: int = PREDICT_TOKENS, extra_args: tuple[str, ...] = ()) -> None:
        self.binary = binary
        self.model = model
        self.log_path = log_path
        self.context_tokens = context_tokens
        self.predict_tokens = predict_tokens
        self.extra_args = extra_args
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        return [
            str(self.binary), "--model", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
            "--ctx-size", str(self.context_tokens), "--n-predict", str(self.predict_tokens),
            "--parallel", "1", "--threads", "1", "--threads-batch", "1", "--no-webui",
            *self.extra_args,
        ]

    def start(self) -> None:
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.process.returncode}:\n{self.log_tail()}")
            if self._healthy():
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama-server was not healthy within {START_TIMEOUT:g} s:\n{self.log_tail()}")

    def _healthy(self) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            connection.request("GET", "/health")
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=15)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Exchange:
    """One request as the server received it, and its answer."""

    method: str
    path: str
    body: dict[str, Any] | None
    status: int
    response: Any  # the decoded JSON answer, else its text
    seconds: float

    @property
    def content(self) -> str | None:
        """The reply's message content, for a chat completion."""
        try:
            return str(self.response["choices"][0]["message"]["content"])
        except (KeyError, IndexError, TypeError):
            return None

    @property
    def finish_reason(self) -> str | None:
        try:
            return str(self.response["choices"][0]["finish_reason"])
        except (KeyError, IndexError, TypeError):
            return None

    @property
    def usage(self) -> dict[str, int] | None:
        usage = self.response.get("usage") if isinstance(self.response, dict) else None
        return usage if isinstance(usage, dict) else None


class RecordingProxy:
    """An HTTP proxy on 127.0.0.1 that forwards to ``upstream_port`` and records every exchange."""

    def __init__(self, upstream_port: int, *, timeout: float = 300.0) -> None:
        self.upstream_port = upstream_port
        self.timeout = timeout
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def completions(self) -> list[Exchange]:
        with self._lock:
            return [e for e in self.exchanges if e.path.endswith("/chat/completions")]

    def clear(self) -> None:
        with self._lock:
            self.exchanges.clear()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _record(self, exchange: Exchange) -> None:
        with self._lock:
            self.exchanges.append(exchange)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._forward(None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self._forward(self.rfile.read(length))

            def _forward(self, raw: bytes | None) -> None:
                started = time.perf_counter()
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=proxy.timeout)
                try:
                    headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
                    upstream.request(self.command, self.path, body=raw, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                    status, content_type = answer.status, answer.getheader("Content-Type", "application/json")
                finally:
                    upstream.close()
                body: dict[str, Any] | None = None
                if raw:
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        body = {"_raw": raw.decode("utf-8", "replace")}
                try:
                    decoded: Any = json.loads(data)
                except ValueError:
                    decoded = data.decode("utf-8", "replace")
                proxy._record(Exchange(self.command, self.path, body, status, decoded,
                                       time.perf_counter() - started))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


@contextmanager
def running(binary: Path, model: Path, log_path: Path) -> Iterator[tuple[LlamaServer, RecordingProxy]]:
    server = LlamaServer(binary, model, log_path)
    server.start()
    proxy = RecordingProxy(server.port)
    proxy.start()
    try:
        yield server, proxy
    finally:
        proxy.stop()
        server.stop()
