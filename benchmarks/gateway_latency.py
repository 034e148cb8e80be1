"""Latency the gateway adds to a chat completion at 100, 1,000 and 5,000 live messages.

For each size, one conversation is first brought to that many messages (one
call that ingests them all), with a window large enough that no compaction
fires (a compaction's own LLM call would dwarf everything else). Then every
round sends, for every size and both modes (non-streamed, streamed), the same
request three times, in rotating order: straight to a local OpenAI-compatible
provider; through ContextLab's gateway served by Daphne (ASGI, as deployed) in
front of that same provider; and through a pass-through proxy under Daphne
(``benchmarks/passthrough_proxy.py``: parse, re-encode, forward, nothing else),
whose hop is what any proxy adds before doing any work of its own. Each round adds a user message and the reply,
so the conversation keeps growing by two messages a round, as an agent's does.
Both sides use the official ``openai`` client over real HTTP on 127.0.0.1; the
difference is what the gateway adds: authentication, parsing the body, finding
the session, ingesting the new message, the hook, re-encoding the body for the
provider, recording the reply and usage.

Printed per size: p50/p95 of the direct call, the gateway call and the
difference (non-streamed total; streamed first event and total); the gateway's
own time on the server (parse + prepare + record, everything but the provider
call) and its split, from the ``Server-Timing`` header of its answers, which a
loaded machine disturbs far less than the client-side difference; and the
floor: parsing the client's JSON body and encoding the upstream body, which any
proxy that changes ``messages`` must do, timed here in this process on the same
bodies.

Run: ``.venv/bin/python benchmarks/gateway_latency.py`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx2  # noqa: E402
from openai import OpenAI  # noqa: E402

from tests.gateway.provider import Answer, Provider  # noqa: E402
from tests.gateway.servers import gateway_under_daphne  # noqa: E402

SIZES = (100, 1_000, 5_000)
SYSTEM = {"role": "system", "content": "You are a build engineer working in /srv/shop. Keep exact paths."}
REPLY = "Checked: the target builds; the warnings in /srv/shop/build.log are unchanged. " * 3
MS = 1000.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def conversation(size: int) -> list[dict[str, Any]]:
    """A system prompt and ``size`` alternating user and assistant messages, distinct per size."""
    messages: list[dict[str, Any]] = [SYSTEM]
    for turn in range(size // 2):
        messages.append({"role": "user", "content": f"[{size}] Turn {turn}: build target t{turn} and report."})
        messages.append({"role": "assistant", "content": REPLY})
    return messages


def server_timing(headers: httpx2.Headers) -> dict[str, float]:
    """``Server-Timing: parse;dur=0.4, prepare;dur=1.2`` as {"parse": 0.4, "prepare": 1.2} (milliseconds)."""
    split: dict[str, float] = {}
    for part in headers.get("server-timing", "").split(","):
        name, _, rest = part.strip().partition(";dur=")
        if name and rest:
            split[name] = float(rest)
    return split


def call(client: OpenAI, messages: list[dict[str, Any]], *, stream: bool) -> tuple[float, float, str, dict[str, float]]:
    """(seconds to the first event or the answer, seconds in total, the reply text, the server's split)."""
    start = time.perf_counter()
    if not stream:
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)  # type: ignore[arg-type]
        reply = raw.parse()
        elapsed = time.perf_counter() - start
        return elapsed, elapsed, reply.choices[0].message.content or "", server_timing(raw.headers)
    first = 0.0
    text: list[str] = []
    raw_stream = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages,  # type: ignore[arg-type]
                                                                  stream=True)
    for chunk in raw_stream.parse():
        if not first:
            first = time.perf_counter() - start
        text.extend(c.delta.content or "" for c in chunk.choices)
    return first, time.perf_counter() - start, "".join(text), server_timing(raw_stream.headers)


def floor_ms(messages: list[dict[str, Any]], repeats: int = 5) -> tuple[float, float]:
    """(parse the client's body, encode the upstream body) in milliseconds, best of ``repeats``."""
    body = {"model": "gpt-4o", "messages": messages}
    data = json.dumps(body).encode()
    parse, encode = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        json.loads(data)
        parse.append(time.perf_counter() - start)
        start = time.perf_counter()
        json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        encode.append(time.perf_counter() - start)
    return min(parse) * MS, min(encode) * MS


@contextmanager
def passthrough_under_daphne(provider_base_url: str, folder: Path) -> Iterator[str]:
    """``benchmarks/passthrough_proxy.py`` served by Daphne in front of the provider; yields its base URL."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    env = {**os.environ, "UPSTREAM_BASE_URL": provider_base_url,
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    with (folder / "passthrough.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "--fd", str(listener.fileno()), "-v", "0",
             "benchmarks.passthrough_proxy:application"],
            cwd=REPO, env=env, pass_fds=(listener.fileno(),), stdout=log, stderr=subprocess.STDOUT)
        listener.close()
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx2.get(f"{url}/ready", timeout=2)
                    break
                except httpx2.TransportError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("the pass-through proxy did not start: "
                                           + (folder / "passthrough.log").read_text(errors="replace")) from None
                    time.sleep(0.1)
            yield f"{url}/v1"
        finally:
            process.terminate()
            process.wait(timeout=10)


def run(rounds: int, sizes: tuple[int, ...], folder: Path) -> dict[str, Any]:
    samples: dict[tuple[int, bool], list[tuple[float, ...]]] = defaultdict(list)
    splits: dict[tuple[int, bool], list[dict[str, float]]] = defaultdict(list)
    floors: dict[int, list[tuple[float, float]]] = defaultdict(list)
    conversations = {size: conversation(size) for size in sizes}
    with Provider(lambda body: Answer(REPLY)) as provider, \
            gateway_under_daphne(folder, provider.base_url, knobs={"max_input_length": 10_000_000}) as gateway, \
            passthrough_under_daphne(provider.base_url, folder) as passthrough_url:
        direct = OpenAI(base_url=provider.base_url, api_key="sk-direct", max_retries=0, timeout=120)
        through = OpenAI(base_url=gateway.url, api_key=gateway.token, max_retries=0, timeout=120)
        floor = OpenAI(base_url=passthrough_url, api_key="sk-floor", max_retries=0, timeout=120)
        for messages in conversations.values():
            # One call brings the session to its size; a second one warms the process's engine cache.
            for opener in ("Start.", "Go on."):
                messages.append({"role": "user", "content": opener})
                messages.append({"role": "assistant", "content": call(through, messages, stream=False)[2]})
            provider.requests.clear()
        for number in range(rounds):
            for size, messages in conversations.items():
                for stream in (False, True):
                    messages.append({"role": "user", "content": f"Round {number}: build the next target."})
                    # Rotate which side goes first, so none always meets a warmer cache.
                    sides = {"direct": direct, "gateway": through, "floor": floor}
                    order = list(sides)[number % 3:] + list(sides)[:number % 3]
                    timed: dict[str, tuple[float, float, str, dict[str, float]]] = {}
                    for side in order:
                        timed[side] = call(sides[side], messages, stream=stream)
                    d_first, d_total = timed["direct"][:2]
                    g_first, g_total, text, split = timed["gateway"]
                    f_first, f_total = timed["floor"][:2]
                    messages.append({"role": "assistant", "content": text})
                    samples[(size, stream)].append((d_first, d_total, g_first, g_total, f_first, f_total))
                    splits[(size, stream)].append(split)
                    provider.requests.clear()  # the fake provider keeps every body otherwise
                if number % max(1, rounds // 5) == 0:
                    floors[size].append(floor_ms(messages))
    return {"samples": samples, "splits": splits, "floors": floors,
            "ends": {size: len(m) - 1 for size, m in conversations.items()}}


def _line(label: str, values: list[float]) -> str:
    return f"    {label:<26} p50 {percentile(values, 50) * MS:8.2f} ms   p95 {percentile(values, 95) * MS:8.2f} ms"


def report(result: dict[str, Any], sizes: tuple[int, ...]) -> None:
    for size in sizes:
        floors = result["floors"][size]
        parse = statistics.median(f[0] for f in floors)
        encode = statistics.median(f[1] for f in floors)
        print(f"\n{size:,} live messages (the conversation ends at {result['ends'][size]:,}); "
              f"floor: parse the body {parse:.2f} ms + encode the upstream body {encode:.2f} ms "
              f"= {parse + encode:.2f} ms")
        for stream in (False, True):
            rows = result["samples"][(size, stream)]
            print(f"  {'streamed' if stream else 'non-streamed'} ({len(rows)} interleaved rounds)")
            if stream:
                print(_line("direct, first event", [r[0] for r in rows]))
                print(_line("gateway, first event", [r[2] for r in rows]))
                print(_line("ADDED to the first event", [r[2] - r[0] for r in rows]))
                print(_line("pass-through, first event", [r[4] for r in rows]))
                print(_line("its hop, first event", [r[4] - r[0] for r in rows]))
                print(_line("GATEWAY OVER PASS-THROUGH", [r[2] - r[4] for r in rows]))
            print(_line("direct, whole answer", [r[1] for r in rows]))
            print(_line("gateway, whole answer", [r[3] for r in rows]))
            print(_line("ADDED to the whole answer", [r[3] - r[1] for r in rows]))
            print(_line("pass-through, whole answer", [r[5] for r in rows]))
            print(_line("its hop, whole answer", [r[5] - r[1] for r in rows]))
            print(_line("GATEWAY OVER PASS-THROUGH", [r[3] - r[5] for r in rows]))
            splits = result["splits"][(size, stream)]
            # The gateway's own time on the server, out of the client's noise: everything but the provider call.
            own = [(s.get("parse", 0.0) + s.get("prepare", 0.0) + s.get("record", 0.0)) / MS for s in splits]
            label = "GATEWAY'S OWN, server side" if not stream else "GATEWAY'S OWN before 1st event"
            print(_line(label, own))
            names = sorted({name for split in splits for name in split})
            parts = [f"{name} {statistics.median(s.get(name, 0.0) for s in result['splits'][(size, stream)]):.2f}"
                     for name in names]
            print(f"    gateway's own split, p50 ms: {', '.join(parts) or '(no Server-Timing header)'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--sizes", type=str, default=",".join(str(s) for s in SIZES))
    parser.add_argument("--quick", action="store_true", help="15 rounds")
    args = parser.parse_args(argv)
    rounds = 15 if args.quick else args.rounds
    sizes = tuple(int(s) for s in args.sizes.split(","))
    load = os.getloadavg()
    print(f"Gateway overhead (Daphne, SQLite, local provider, no compaction); {rounds} rounds; "
          f"{os.cpu_count()} CPUs, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the start")
    with tempfile.TemporaryDirectory(prefix="contextlab-gateway-bench-") as tmp:
        result = run(rounds, sizes, Path(tmp))
    report(result, sizes)
    load = os.getloadavg()
    print(f"\nload average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
