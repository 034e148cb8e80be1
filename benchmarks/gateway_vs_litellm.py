"""ContextLab's gateway beside LiteLLM's proxy, in one run, at ~100 and ~1,000 messages.

Sides, each in its own process, all in front of the same fake provider:

- ``direct``: the fake provider itself (stdlib, its own process, TCP_NODELAY,
  answers at once); every other side's figure is what it adds to this one in
  the same round;
- ``ContextLab manage`` and ``ContextLab observe``: the project served as
  ``scripts/start.sh`` serves it (SQLite, one process), one profile per mode,
  a window so large that nothing compacts; ``--scaled`` adds the same two
  against PostgreSQL + Redis (``DATABASE_URL`` / ``REDIS_URL`` of the
  environment), reported beside them;
- ``LiteLLM``: ``litellm[proxy]`` from PyPI in its own virtualenv under
  ``var/bench-litellm-venv`` (installed on first use; never a dependency of the
  project), ``--num_workers 1``, a master key, no database, logging off, one
  model routed to the fake provider as ``openai/gpt-4o``;
- ``floor``: a recording proxy of ~40 lines (``_serve_floor`` below: stdlib,
  threads, forwards the bytes and stores each turn in SQLite), what recording
  a turn costs at the least.

Every conversation is its own, as a real agent's are: each of its user
messages carries its tag (``[<tag>] Turn 0: ...``, ``[<tag>] Round 3: ...``)
and the fake provider answers it with replies of its own (the same words,
tagged: ``reply_for``). Were the later messages and replies the same in every
conversation, observe mode's inference of conversation identity (which weighs
the messages two requests share, and carries no session header here) would
rightly merge them all into one session, and every call would rewrite a session
holding all of them: a cost no real agent brings about, which once made observe
mode look 13.5× LiteLLM at ~100 messages.

A conversation per size is grown to about the size; every call is the whole
history plus one new user message, on a new connection, sent to every side in
a rotating order (so no side always meets the warmer cache), non-streamed and
streamed (time to the first byte of the body, and to the end). Then 8 client
threads, each with its own conversation of ~100 messages, send 200 calls to
one side after the other (rotating, ``--throughput-runs`` times), for
requests/s and the side's CPU per call.

Run: ``.venv/bin/python benchmarks/gateway_vs_litellm.py`` (``--quick`` for a
short run; ``--server daphne,granian`` to serve ContextLab with other ASGI servers too).
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LITELLM_VENV = REPO / "var" / "bench-litellm-venv"
REPLY = "Checked: the target builds; the warnings in /srv/shop/build.log are unchanged. " * 3
SYSTEM = "You are a build engineer working in /srv/shop. Keep exact paths."
MASTER_KEY = "sk-bench-master"
# Each conversation opens with "[<tag>] Turn 0:"; the fake provider answers it with that tag in its reply.
TAGGED = re.compile(rb'"\[([^\]"\\]{1,80})\] Turn 0:')


def reply_for(tag: str) -> str:
    """The fake provider's reply in the conversation ``tag``: the same words, its own conversation's."""
    return f"[{tag}] {REPLY}" if tag else REPLY

MS = 1000.0

# -- the fake provider and the floor, each run as ``python this_file --upstream|--floor PORT`` ----------


def _serve_upstream(port: int) -> None:
    """An OpenAI-compatible provider that answers at once (no parsing beyond what it must)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    streamed = re.compile(rb'"stream"\s*:\s*true')
    wants_usage = re.compile(rb'"include_usage"\s*:\s*true')
    usage = {"prompt_tokens": 321, "completion_tokens": 54, "total_tokens": 375}
    head = {"id": "chatcmpl-bench", "created": 1_774_000_000, "model": "gpt-4o"}

    def chunk(choices: list[Any], **extra: Any) -> bytes:
        return b"data: " + json.dumps({**head, "object": "chat.completion.chunk", "choices": choices,
                                       **extra}).encode() + b"\n\n"

    @functools.lru_cache(maxsize=4096)
    def answers(tag: str) -> tuple[bytes, list[bytes]]:
        """The completion and the stream's events answering the conversation ``tag``."""
        reply = reply_for(tag)
        completion = json.dumps({**head, "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
            "usage": usage}).encode()
        third = len(reply) // 3
        pieces = [reply[:third], reply[third:2 * third], reply[2 * third:]]
        events = [chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]),
                  *(chunk([{"index": 0, "delta": {"content": p}, "finish_reason": None}]) for p in pieces),
                  chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])]
        return completion, events

    usage_event = chunk([], usage=usage)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            data = b'{"object":"list","data":[{"id":"gpt-4o","object":"model","owned_by":"bench"}]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            found = TAGGED.search(body)
            completion, events = answers(found.group(1).decode() if found else "")
            if not streamed.search(body):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(completion)))
                self.end_headers()
                self.wfile.write(completion)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            out = [*events, *([usage_event] if wants_usage.search(body) else []), b"data: [DONE]\n\n"]
            for event in out:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.write(b"0\r\n\r\n")

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def _serve_floor(port: int, upstream_port: int, database: str) -> None:
    """The least a recording proxy does: parse, forward, pass the answer on, store the turn."""
    import sqlite3
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    db = sqlite3.connect(database, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS turns (id INTEGER PRIMARY KEY, request BLOB, reply BLOB)")
    lock, local = threading.Lock(), threading.local()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.loads(raw)  # a recorder must understand what it records
            if not hasattr(local, "up"):
                local.up = http.client.HTTPConnection("127.0.0.1", upstream_port)
            local.up.request("POST", "/v1/chat/completions", raw, {"Content-Type": "application/json"})
            answer = local.up.getresponse()
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.getheader("Content-Type", "application/json"))
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            reply = []
            while data := answer.read1(65536) if body.get("stream") else answer.read():
                reply.append(data)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.write(b"0\r\n\r\n")
            with lock:
                db.execute("INSERT INTO turns (request, reply) VALUES (?, ?)", (raw, b"".join(reply)))

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


# -- processes -------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(port: int, process: subprocess.Popen[bytes], log: Path, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen within {timeout:.0f} s:\n{log.read_text(errors='replace')[-3000:]}")


@contextmanager
def process(command: list[str], port: int, folder: Path, name: str, env: dict[str, str] | None = None,
            ) -> Iterator[subprocess.Popen[bytes]]:
    log_path = folder / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=env or dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait(port, proc, log_path, name)
            yield proc
        finally:
            # SIGINT: a graceful stop for every server, and what makes py-spy write its profile.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


SERVERS: dict[str, Callable[[int], list[str]]] = {
    "daphne": lambda port: [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "-v", "0",
                            "contextlab.asgi:application"],
    "uvicorn": lambda port: [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port),
                             "--loop", "uvloop", "--http", "contextlab.core.uvicorn_http:HeaderTimeoutHttpTools", "--ws", "websockets", "--lifespan", "off",
                             "--no-access-log", "--log-level", "warning", "contextlab.asgi:application"],
    "hypercorn": lambda port: [sys.executable, "-m", "hypercorn", "-b", f"127.0.0.1:{port}",
                               "contextlab.asgi:application"],
    "granian": lambda port: [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1",
                             "--port", str(port), "--loop", "uvloop", "--log-level", "warning",
                             "contextlab.asgi:application"],
}

SEED = """
import json, sys, uuid
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth.models import User
from contextlab.api.models import ApiToken
from contextlab.gateway.models import UpstreamProvider
from contextlab.sessions import services
base_url = sys.argv[1]
user = User.objects.create_user(f"bench-{uuid.uuid4().hex[:12]}", "bench@example.org", "pw")
for mode in ("manage", "observe"):
    profile = services.profile_create(owner=user, name=mode, knobs={"max_input_length": 10_000_000})
    UpstreamProvider.objects.create(profile=profile, base_url=base_url, api_key="sk-upstream", timeout=60, mode=mode)
print(ApiToken.issue(user=user, name="bench")[1])
"""


@contextmanager
def contextlab(folder: Path, upstream_url: str, server: str, *, scaled: bool) -> Iterator[tuple[int, str, int]]:
    """ContextLab served by ``server``; yields (port, token, pid)."""
    env = dict(os.environ)
    env.update({"DJANGO_SETTINGS_MODULE": "contextlab.settings", "CONTEXTLAB_EMBEDDED_BEAT": "false",
                "CONTEXTLAB_TIKTOKEN_DIR": env.get("CONTEXTLAB_TIKTOKEN_DIR") or str(REPO / "var" / "tiktoken"),
                "CONTEXTLAB_WORKSPACES_DIR": str(folder / f"workspaces-{scaled}"),
                "CONTEXTLAB_VAR_DIR": str(folder / f"var-{scaled}")})
    if scaled:
        if not env.get("DATABASE_URL", "").startswith("postgres"):
            raise SystemExit("--scaled needs DATABASE_URL (PostgreSQL) and REDIS_URL in the environment")
        env.setdefault("SECRET_KEY", "bench")
    else:
        env.update({"DATABASE_URL": f"sqlite:///{folder / 'contextlab.sqlite3'}", "REDIS_URL": ""})
    seeded = subprocess.run([sys.executable, "-c", SEED, upstream_url], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    if seeded.returncode != 0:
        raise RuntimeError(f"seeding ContextLab failed:\n{seeded.stderr}")
    token = seeded.stdout.strip().splitlines()[-1]
    port = free_port()
    command = SERVERS[server](port)
    if os.environ.get("BENCH_PROFILE"):
        # Where ContextLab's time goes: py-spy samples the server (collapsed stacks, a file per server and mode).
        out = f"{os.environ['BENCH_PROFILE']}-{server}-{'scaled' if scaled else 'embedded'}.txt"
        command = [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw", "--rate", "250",
                   "--nonblocking", "-o", out, "--", *command]
    with process(command, port, folder, f"contextlab-{server}-{'scaled' if scaled else 'embedded'}",
                 env) as proc:
        yield port, token, proc.pid


def ensure_litellm() -> Path:
    binary = LITELLM_VENV / "bin" / "litellm"
    if not binary.exists():
        print("installing litellm[proxy] into", LITELLM_VENV.relative_to(REPO), "(once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "--quiet", "litellm[proxy]"], check=True)
    return binary


def litellm_version() -> str:
    out = subprocess.run([str(LITELLM_VENV / "bin" / "python"), "-c",
                          "import importlib.metadata as m; print(m.version('litellm'))"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip() or "?"


@contextmanager
def litellm(folder: Path, upstream_url: str) -> Iterator[tuple[int, int]]:
    binary = ensure_litellm()
    config = folder / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: gpt-4o\n"
        "    litellm_params:\n"
        "      model: openai/gpt-4o\n"
        f"      api_base: {upstream_url}\n"
        "      api_key: sk-upstream\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  turn_off_message_logging: true\n"
        "general_settings:\n"
        f"  master_key: {MASTER_KEY}\n"
        "  disable_spend_logs: true\n")
    # No database: the variables the environment may hold for ContextLab's scaled mode are not LiteLLM's.
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update({"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False"})
    port = free_port()
    with process([str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                  "--num_workers", "1"], port, folder, "litellm", env) as proc:
        yield port, proc.pid


# -- the client ------------------------------------------------------------------------------------------


@dataclass
class Side:
    name: str
    port: int
    headers: dict[str, str]
    pid: int | None = None
    path: str = "/v1/chat/completions"


def call(side: Side, body: bytes, *, stream: bool) -> tuple[float, float]:
    """(seconds to the first byte of the body, seconds to its end), on a new connection."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", side.port, timeout=120)
    try:
        conn.connect()
        assert conn.sock is not None
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.request("POST", side.path, body, {"Content-Type": "application/json", **side.headers})
        answer = conn.getresponse()
        data = answer.read1(65536)
        first = time.perf_counter() - start
        data += answer.read()
        total = time.perf_counter() - start
    finally:
        conn.close()
    if answer.status != 200 or (b"[DONE]" not in data if stream else b"/srv/shop/build.log" not in data):
        raise RuntimeError(f"{side.name}: HTTP {answer.status}: {data[:500]!r}")
    return first, total


def body_of(messages: list[dict[str, Any]], *, stream: bool) -> bytes:
    return json.dumps({"model": "gpt-4o", "messages": messages, "stream": stream}).encode()


def conversation(tag: str, size: int) -> list[dict[str, Any]]:
    """A system prompt and ``size`` alternating user and assistant messages, distinct per tag."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(size // 2):
        messages.append({"role": "user", "content": f"[{tag}] Turn {turn}: build target t{turn} and report."})
        messages.append({"role": "assistant", "content": reply_for(tag)})
    return messages


def tag_of(messages: list[dict[str, Any]]) -> str:
    """The conversation's tag, read from its first user message."""
    opening = str(messages[1]["content"]) if len(messages) > 1 else ""
    return opening[1:opening.index("]")] if opening.startswith("[") and "] Turn 0:" in opening else ""


def asked(messages: list[dict[str, Any]], text: str) -> dict[str, Any]:
    """A new user message of this conversation (its words are its own, as in a real agent's)."""
    return {"role": "user", "content": f"[{tag_of(messages)}] {text}"}


def answered(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The reply the fake provider gives in this conversation, as the client adds it to its history."""
    return {"role": "assistant", "content": reply_for(tag_of(messages))}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def tree_cpu(pid: int) -> float:
    """CPU seconds used so far by a process and its descendants (Linux /proc)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo.extend(child for child, parent in parents.items() if parent == current)
    return total


# -- the measurements ------------------------------------------------------------------------------------


def latency(sides: list[Side], sizes: list[int], rounds: int) -> dict[tuple[int, bool, str], list[tuple[float, float]]]:
    """Per (size, stream, side): (first byte, total) of each round, minus the direct call's of that round."""
    added: dict[tuple[int, bool, str], list[tuple[float, float]]] = defaultdict(list)
    conversations = {(size, stream): conversation(f"{size}{'s' if stream else ''}", max(2, size - rounds))
                     for size in sizes for stream in (False, True)}
    for (_size, stream), messages in conversations.items():
        for opener in ("Start.", "Go on."):  # the first brings ContextLab's sessions to size, the second warms
            messages.append(asked(messages, opener))
            body = body_of(messages, stream=stream)
            for side in sides:
                call(side, body, stream=stream)
            messages.append(answered(messages))
    for number in range(rounds):
        for (size, stream), messages in conversations.items():
            messages.append(asked(messages, f"Round {number}: build the next target."))
            body = body_of(messages, stream=stream)
            order = sides[number % len(sides):] + sides[:number % len(sides)]
            timed = {side.name: call(side, body, stream=stream) for side in order}
            messages.append(answered(messages))
            direct = timed["direct"]
            for name, (first, total) in timed.items():
                added[(size, stream, name)].append(
                    (first, total) if name == "direct" else (first - direct[0], total - direct[1]))
    return added


def _client(side: Side, messages: list[dict[str, Any]], calls: int, errors: list[BaseException]) -> None:
    try:
        for n in range(calls):
            messages.append(asked(messages, f"Call {n}: next target."))
            call(side, body_of(messages, stream=False), stream=False)
            messages.append(answered(messages))
    except BaseException as exc:  # reported after the run
        errors.append(exc)


@dataclass
class Throughput:
    rps: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)


def throughput(sides: list[Side], clients: int, calls: int, runs: int, size: int) -> dict[str, Throughput]:
    results: dict[str, Throughput] = defaultdict(Throughput)
    for run in range(runs):
        order = sides[run % len(sides):] + sides[:run % len(sides)]
        for side in order:
            conversations = [conversation(f"tp{run}-{side.name}-{c}", size) for c in range(clients)]
            for messages in conversations:  # untimed: brings a ContextLab session to size
                messages.append(asked(messages, "Start."))
                call(side, body_of(messages, stream=False), stream=False)
                messages.append(answered(messages))
            remaining = [calls // clients + (1 if c < calls % clients else 0) for c in range(clients)]
            errors: list[BaseException] = []
            threads = [threading.Thread(target=_client, args=(side, conversations[c], remaining[c], errors))
                       for c in range(clients)]
            cpu = tree_cpu(side.pid) if side.pid else 0.0
            start = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            elapsed = time.perf_counter() - start
            if errors:
                raise errors[0]
            results[side.name].rps.append(calls / elapsed)
            if side.pid:
                results[side.name].cpu_ms.append((tree_cpu(side.pid) - cpu) / calls * MS)
    return results


# -- the report ------------------------------------------------------------------------------------------


def report(added: dict[tuple[int, bool, str], list[tuple[float, float]]], tp: dict[str, Throughput],
           sides: list[Side], sizes: list[int], rounds: int, clients: int, calls: int) -> None:
    names = [s.name for s in sides]
    reference = "LiteLLM" if "LiteLLM" in names else None

    def p(values: list[float], q: float) -> float:
        return percentile(values, q) * MS

    for size in sizes:
        print(f"\n~{size:,} messages ({rounds} rounds, each call's history {max(2, size - rounds) + 2:,} → "
              f"{max(2, size - rounds) + 2 * rounds + 2:,} messages); ms added to the direct call (direct: its own time)")
        print("| side | non-streamed p50 | p95 | p50 ÷ LiteLLM | p95 ÷ LiteLLM | streamed first byte p50 | p95 "
              "| p50 ÷ LiteLLM | streamed total p50 | p95 | p50 ÷ LiteLLM |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for name in names:
            plain = added[(size, False, name)]
            streamed = added[(size, True, name)]
            cells = [name]
            for rows, index, with_p95_ratio in ((plain, 1, True), (streamed, 0, False), (streamed, 1, False)):
                values = [r[index] for r in rows]
                cells += [f"{p(values, 50):.2f}", f"{p(values, 95):.2f}"]
                if reference and name not in ("direct",):
                    ref = [r[index] for r in added[(size, rows is streamed, reference)]]
                    cells.append(f"{p(values, 50) / p(ref, 50):.2f}" if p(ref, 50) > 0 else "-")
                    if with_p95_ratio:
                        cells.append(f"{p(values, 95) / p(ref, 95):.2f}" if p(ref, 95) > 0 else "-")
                else:
                    cells += ["", ""] if with_p95_ratio else [""]
            print("| " + " | ".join(cells) + " |")
    if tp:
        print(f"\n{clients} concurrent clients, {calls} calls per run, ~100 messages, non-streamed")
        print("| side | requests/s (median of runs) | ÷ LiteLLM | CPU ms per call (server process) |")
        print("|---|---|---|---|")
        ref_rps = statistics.median(tp[reference].rps) if reference and reference in tp else None
        for name in names:
            if name not in tp:
                continue
            rps = statistics.median(tp[name].rps)
            cpu = f"{statistics.median(tp[name].cpu_ms):.1f}" if tp[name].cpu_ms else "-"
            ratio = f"{rps / ref_rps:.2f}" if ref_rps else "-"
            print(f"| {name} | {rps:.0f} ({', '.join(f'{r:.0f}' for r in tp[name].rps)}) | {ratio} | {cpu} |")


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] in ("--upstream", "--floor"):
        if sys.argv[1] == "--upstream":
            _serve_upstream(int(sys.argv[2]))
        else:
            _serve_floor(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--server", default="uvicorn", help="ASGI servers for ContextLab, comma-separated: "
                                                          + ", ".join(SERVERS))
    parser.add_argument("--modes", default="manage,observe", help="ContextLab's gateway modes, comma-separated")
    parser.add_argument("--scaled", action="store_true", help="also ContextLab on DATABASE_URL + REDIS_URL")
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--throughput-runs", type=int, default=2)
    parser.add_argument("--throughput-observe", action="store_true",
                        help="observe mode in the throughput too (one call takes 0.1-1 s there)")
    parser.add_argument("--quick", action="store_true", help="10 rounds, one throughput run")
    args = parser.parse_args(argv)
    rounds = 10 if args.quick else args.rounds
    runs = 1 if args.quick else args.throughput_runs
    sizes = [int(s) for s in args.sizes.split(",")]
    servers = args.server.split(",")
    load = os.getloadavg()
    print(f"gateway_vs_litellm: {os.cpu_count()} CPUs, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
          f" at the start; ContextLab served by {', '.join(servers)}")
    with tempfile.TemporaryDirectory(prefix="contextlab-vs-litellm-") as tmp, ExitStack() as stack:
        folder = Path(tmp)
        upstream_port = free_port()
        stack.enter_context(process([sys.executable, __file__, "--upstream", str(upstream_port)], upstream_port,
                                    folder, "upstream"))
        upstream_url = f"http://127.0.0.1:{upstream_port}/v1"
        sides = [Side("direct", upstream_port, {"Authorization": "Bearer sk-direct"})]
        for server in servers:
            for scaled in (False, True) if args.scaled else (False,):
                port, token, pid = stack.enter_context(contextlab(folder, upstream_url, server, scaled=scaled))
                label = "ContextLab" + (f" [{server}]" if len(servers) > 1 else "") + (" scaled" if scaled else "")
                for mode in args.modes.split(","):
                    sides.append(Side(f"{label} {mode}", port, {"Authorization": f"Bearer {token}",
                                                               "X-ContextLab-Profile": mode}, pid))
        if not args.no_litellm:
            port, pid = stack.enter_context(litellm(folder, upstream_url))
            sides.append(Side("LiteLLM", port, {"Authorization": f"Bearer {MASTER_KEY}"}, pid))
        floor_port = free_port()
        floor = stack.enter_context(process(
            [sys.executable, __file__, "--floor", str(floor_port), str(upstream_port), str(folder / "floor.sqlite3")],
            floor_port, folder, "floor"))
        sides.append(Side("floor", floor_port, {}, floor.pid))
        if not args.no_litellm:
            print(f"LiteLLM {litellm_version()} (--num_workers 1, master key, no database)")
        try:
            added = latency(sides, sizes, rounds)
            tp = throughput([s for s in sides if args.throughput_observe or not s.name.endswith(" observe")],
                            args.clients, args.calls, runs, 100)
        except Exception:
            for log in sorted(folder.glob("*.log")):  # the servers' side of what went wrong
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-4000:]}", file=sys.stderr)
            raise
    report(added, tp, sides, sizes, rounds, args.clients, args.calls)
    load = os.getloadavg()
    print(f"\nload average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
