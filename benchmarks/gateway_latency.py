"""Latency the gateway adds to a chat completion, against calling the provider directly.

One agent conversation grows by a user message and a reply per turn, with a
window large enough that no compaction fires (a compaction's own LLM call
would dwarf everything else). Every turn is sent twice, interleaved: straight
to a local OpenAI-compatible provider, and through ContextLab's gateway served
by Daphne (ASGI, as deployed) in front of the same provider. Both use the
official ``openai`` client over real HTTP on 127.0.0.1; the difference is what
the gateway adds: authentication, finding the session, ingesting the new
message, the hook, recording the reply and usage.

Printed: p50/p95 per mode (non-streamed total; streamed time to first event and
total), the added latency, how it grows with the session, and the gateway's own
split of that time (from its exchange rows).

Run: ``.venv/bin/python benchmarks/gateway_latency.py`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from openai import OpenAI  # noqa: E402

from tests.gateway.provider import Answer, Provider  # noqa: E402
from tests.gateway.servers import gateway_under_daphne  # noqa: E402

SYSTEM = {"role": "system", "content": "You are a build engineer working in /srv/shop. Keep exact paths."}
REPLY = "Checked: the target builds; the warnings in /srv/shop/build.log are unchanged. " * 3


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def _call(client: OpenAI, messages: list[dict[str, Any]], *, stream: bool) -> tuple[float, float, str]:
    """(seconds to the first event or the answer, seconds in total, the reply text)."""
    start = time.perf_counter()
    if not stream:
        reply = client.chat.completions.create(model="gpt-4o", messages=messages)  # type: ignore[arg-type]
        elapsed = time.perf_counter() - start
        return elapsed, elapsed, reply.choices[0].message.content or ""
    first = 0.0
    text: list[str] = []
    for chunk in client.chat.completions.create(model="gpt-4o", messages=messages,  # type: ignore[arg-type]
                                                stream=True):
        if not first:
            first = time.perf_counter() - start
        text.extend(c.delta.content or "" for c in chunk.choices)
    return first, time.perf_counter() - start, "".join(text)


def run(turns: int, *, stream: bool, folder: Path) -> dict[str, Any]:
    with Provider(lambda body: Answer(REPLY)) as provider, \
            gateway_under_daphne(folder, provider.base_url, knobs={"max_input_length": 1_000_000}) as gateway:
        direct = OpenAI(base_url=provider.base_url, api_key="sk-direct", max_retries=0)
        through = OpenAI(base_url=gateway.url, api_key=gateway.token, max_retries=0)
        messages: list[dict[str, Any]] = [SYSTEM]
        rows: list[tuple[float, float, float, float]] = []
        for turn in range(1, turns + 1):
            messages.append({"role": "user", "content": f"Turn {turn}: build target t{turn} and report."})
            d_first, d_total, _ = _call(direct, messages, stream=stream)
            g_first, g_total, text = _call(through, messages, stream=stream)
            messages.append({"role": "assistant", "content": text})
            rows.append((d_first, d_total, g_first, g_total))
        with sqlite3.connect(gateway.database) as db:
            split = db.execute("SELECT prepare_ms, upstream_ms, managed, identity, error FROM "
                               "gateway_gatewayexchange ORDER BY id").fetchall()
    failed = [s[4] for s in split if not s[2]]
    if failed:
        # Unmanaged calls skip the work being measured: the figures would be meaningless.
        raise SystemExit(f"{len(failed)} call(s) went through unmanaged, first because: {failed[0]}")
    return {"rows": rows, "split": split, "messages": len(messages)}


def report(name: str, result: dict[str, Any], *, stream: bool) -> None:
    rows = result["rows"]
    ms = 1000.0
    print(f"\n{name}: {len(rows)} turns, the conversation ends at {result['messages']} messages")
    columns = [("direct", [r[1] for r in rows]), ("gateway", [r[3] for r in rows]),
               ("added", [r[3] - r[1] for r in rows])]
    if stream:
        columns = [("direct first event", [r[0] for r in rows]), ("gateway first event", [r[2] for r in rows]),
                   ("added to first event", [r[2] - r[0] for r in rows]), *columns]
    for label, values in columns:
        print(f"  {label:<24} p50 {percentile(values, 50) * ms:7.2f} ms   p95 {percentile(values, 95) * ms:7.2f} ms")
    size = max(1, len(rows) // 4)
    for label, part in (("first quarter", rows[:size]), ("last quarter", rows[-size:])):
        added = [r[3] - r[1] for r in part]
        print(f"  added, {label:<16} p50 {percentile(added, 50) * ms:7.2f} ms   p95 {percentile(added, 95) * ms:7.2f} ms")
    split = result["split"]
    unmanaged = sum(1 for s in split if not s[2])
    identities = sorted({s[3] for s in split})
    print(f"  gateway's own record: prepare (session + ingest + hook) p50 "
          f"{statistics.median(s[0] for s in split):.2f} ms; provider call p50 "
          f"{statistics.median(s[1] for s in split):.2f} ms; unmanaged calls {unmanaged}; identities {identities}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="40 turns")
    args = parser.parse_args(argv)
    turns = 40 if args.quick else args.turns
    print("Gateway latency (Daphne, SQLite, local provider; turns without compaction)")
    with tempfile.TemporaryDirectory(prefix="contextlab-gateway-bench-") as tmp:
        for stream in (False, True):
            name = "streamed" if stream else "non-streamed"
            report(name, run(turns, stream=stream, folder=Path(tmp) / name), stream=stream)
    return 0


if __name__ == "__main__":
    sys.exit(main())
