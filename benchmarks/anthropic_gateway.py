"""What the gateway adds to an Anthropic Messages call and to a Responses API call, against a chat
completion of the same conversation.

Three gateways under Daphne (ASGI, as deployed), in front of a local
OpenAI-compatible provider, a local Anthropic provider and a local Responses
API provider, each with its own SQLite database, in ``manage`` or ``observe``
mode. For each size (100 and 1,000 content blocks or items: text messages
alternating user/assistant), one conversation per protocol is brought to that
size, then every round sends the
same conversation, one user message and one reply longer, straight to each
provider and through each gateway, in rotating order, with the same plain HTTP
client. Printed per size and protocol: p50/p95 of the gateway call minus the
direct call (what the gateway adds). Non-streamed, no compaction (a window of
10 M tokens).

Run: ``.venv/bin/python benchmarks/anthropic_gateway.py [--mode observe] [--rounds 15]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx2  # noqa: E402

from tests.gateway.anthropic_provider import AnthropicProvider, text  # noqa: E402
from tests.gateway.provider import Answer, Provider  # noqa: E402
from tests.gateway.responses_upstream import Reply, ResponsesUpstream  # noqa: E402
from tests.gateway.responses_upstream import text as output_text  # noqa: E402
from tests.gateway.servers import gateway_under_daphne  # noqa: E402

SIZES = (100, 1_000)
SYSTEM = "You are a build engineer working in /srv/shop. Keep exact paths."
REPLY = "Checked: the target builds; the warnings in /srv/shop/build.log are unchanged. " * 3


def _texts(size: int) -> list[tuple[str, str]]:
    return [("user" if i % 2 == 0 else "assistant",
             f"Step {i}: look at /srv/shop/src/module_{i}.py and report. " * 4) for i in range(size)]


def _chat(texts: list[tuple[str, str]]) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": [{"role": "system", "content": SYSTEM},
                                            *({"role": r, "content": t} for r, t in texts)]}


def _anthropic(texts: list[tuple[str, str]]) -> dict[str, Any]:
    return {"model": "claude-sonnet-5", "max_tokens": 100, "system": SYSTEM,
            "messages": [{"role": r, "content": [{"type": "text", "text": t}]} for r, t in texts]}


def _responses(texts: list[tuple[str, str]], key: str) -> dict[str, Any]:
    # Named as Codex names its conversation (``prompt_cache_key``), sent whole as Codex sends it.
    return {"model": "gpt-5", "instructions": SYSTEM, "store": False, "prompt_cache_key": key,
            "input": [{"role": "user", "content": t} if r == "user" else
                      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": t}]}
                      for r, t in texts]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--mode", choices=("manage", "observe"), default="manage")
    args = parser.parse_args()
    knobs = {"max_input_length": 10_000_000}
    with tempfile.TemporaryDirectory() as folder, Provider() as chat_provider, AnthropicProvider() as claude, \
            ResponsesUpstream(lambda request: Reply([output_text(REPLY)])) as responses, \
            gateway_under_daphne(Path(folder) / "chat", chat_provider.base_url, knobs=knobs,
                                 provider={"mode": args.mode}) as chat_gateway, \
            gateway_under_daphne(Path(folder) / "anthropic", claude.base_url, knobs=knobs,
                                 provider={"mode": args.mode, "kind": "anthropic"}) as claude_gateway, \
            gateway_under_daphne(Path(folder) / "responses", responses.base_url, knobs=knobs,
                                 provider={"mode": args.mode}) as responses_gateway:
        chat_provider.responder = lambda body: Answer(REPLY)
        claude.brain = lambda body: text(REPLY)
        http = httpx2.Client(timeout=120)
        targets = {
            "chat": (f"{chat_provider.base_url}/chat/completions", f"{chat_gateway.url}/chat/completions",
                     {"Authorization": "Bearer sk-direct"}, {"Authorization": f"Bearer {chat_gateway.token}"}),
            "anthropic": (f"{claude.base_url}/messages", f"{claude_gateway.url}/messages",
                          {"x-api-key": "sk-direct"},
                          # Claude Code names its conversation in this header on every call.
                          {"x-api-key": claude_gateway.token, "X-Claude-Code-Session-Id": "bench"}),
            "responses": (f"{responses.base_url}/responses", f"{responses_gateway.url}/responses",
                          {"Authorization": "Bearer sk-direct"},
                          {"Authorization": f"Bearer {responses_gateway.token}"}),
        }
        print(f"mode {args.mode}, {args.rounds} rounds; what the gateway adds (gateway − direct), ms")
        for size in SIZES:
            targets["anthropic"][3]["X-Claude-Code-Session-Id"] = f"bench-{size}"
            texts = [*_texts(size - 1), ("user", "Go on.")]
            added: dict[str, list[float]] = {"chat": [], "anthropic": [], "responses": []}
            for round_number in range(args.rounds + 1):
                bodies = {"chat": _chat(texts), "anthropic": _anthropic(texts),
                          "responses": _responses(texts, f"bench-{size}")}
                # Rotating order: no protocol always runs right after another's write.
                order = ["chat", "anthropic", "responses"]
                order = order[round_number % 3:] + order[:round_number % 3]
                for protocol in order:
                    direct_url, gateway_url, direct_headers, gateway_headers = targets[protocol]
                    timings = []
                    for url, headers in ((direct_url, direct_headers), (gateway_url, gateway_headers)):
                        start = time.perf_counter()
                        answer = http.post(url, json=bodies[protocol], headers=headers)
                        timings.append((time.perf_counter() - start) * 1000)
                        assert answer.status_code == 200, answer.text[:300]
                    if round_number:  # the first round ingests the whole history
                        added[protocol].append(timings[1] - timings[0])
                # The reply joins the history, then the next user message: as an agent's grows.
                texts = [*texts, ("assistant", REPLY), ("user", f"Round {round_number}: and now?")]
            for protocol, values in added.items():
                values.sort()
                p95 = values[min(len(values) - 1, int(len(values) * 0.95))]
                print(f"  {size:>5} blocks  {protocol:<9} p50 {statistics.median(values):6.1f}  p95 {p95:6.1f}")


if __name__ == "__main__":
    main()
