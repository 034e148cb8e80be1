"""How many prompt tokens the tool definitions of real requests cost.

Two parts:

1. **CoPaw 1.0.2 requests** (the shared corpus' ``copaw-1.0.2/requests``): per
   distinct tool set, the layer as ``contextlab.engine.core.schemas`` counts it
   (OpenAI's per-item formula, o200k_base) beside the tokens of the same
   definitions as plain JSON and the messages' own count, to show what a
   messages-only count misses. These requests carry no provider usage (the run
   used a local fake model), so there is nothing billed to compare with.
2. **OpenHands against the provider's bill**: the OpenHands transcript records,
   per LLM call, the completion with the provider's ``usage.prompt_tokens``; the
   messages the call was sent are those before it in the imported transcript,
   the tools are those of its system event. For every call this prints
   ContextLab's count (system prompt + messages + tool layer + reply priming,
   with the encoding the model name resolves to) beside the billed tokens, the
   difference and the ratio, then the median and largest absolute difference
   and how much the difference grows per call.

Run: ``.venv/bin/python benchmarks/tool_schemas.py`` (``--calls`` prints every call).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contextlab.engine.convert.openai import from_openai  # noqa: E402
from contextlab.engine.core.messages import Message  # noqa: E402
from contextlab.engine.core.schemas import tool_tokens  # noqa: E402
from contextlab.engine.core.tokens import REPLY_PRIMING_TOKENS, TiktokenCounter, resolve_encoding_name  # noqa: E402
from contextlab.engine.importers import load_transcript  # noqa: E402
from tests.corpus import SHARED, corpus_path  # noqa: E402

REQUESTS = SHARED / "corpus" / "copaw-1.0.2" / "requests"
OPENHANDS = "openhands/multi_swe_bench_output.ponylang__ponyc-4588.jsonl"


def copaw_requests() -> None:
    counter = TiktokenCounter()
    seen: dict[str, tuple[str, int, int, int, int]] = {}
    for path in sorted(REQUESTS.glob("*.json")):
        body = json.loads(path.read_text(encoding="utf-8"))["body"]
        tools = body.get("tools") or []
        key = json.dumps(sorted(t["function"]["name"] for t in tools))
        if key in seen:
            continue
        try:
            messages = sum(counter.count_message(m) for m in from_openai(body["messages"]))
        except Exception:  # a body the converter refuses: show the tools anyway
            messages = -1
        as_json = counter.count_text(json.dumps(tools, ensure_ascii=False))
        seen[key] = (path.name, len(tools), tool_tokens(counter, tools), as_json, messages)
    print(f"{'first request':<14} {'tools':>5} {'layer':>7} {'as JSON':>8} {'messages':>9}")
    for name, count, layer, as_json, messages in seen.values():
        print(f"{name:<14} {count:>5} {layer:>7,} {as_json:>8,} {messages:>9,}")


def openhands_against_usage(show_calls: bool) -> None:
    transcript = load_transcript(corpus_path(OPENHANDS))
    model = next(str(m.metadata["model"]) for m in transcript.messages if m.metadata.get("model"))
    encoding = resolve_encoding_name(model)
    counter = TiktokenCounter(encoding)
    system = counter.count_message(Message.text("system", transcript.system_prompt or "", id="system"))
    layer = tool_tokens(counter, transcript.tools)
    print(f"\nOpenHands ({model}, counted with {encoding}): system prompt {system:,} tokens, "
          f"{len(transcript.tools)} tools = {layer:,} tokens")
    rows: list[tuple[int, int, int, int]] = []
    for index, message in enumerate(transcript.messages):
        usage = message.metadata.get("usage")
        if message.role != "assistant" or not isinstance(usage, dict) or "prompt_tokens" not in usage:
            continue
        ours = system + layer + counter.count_messages(transcript.messages[:index]) + REPLY_PRIMING_TOKENS
        rows.append((len(rows) + 1, index, ours, int(usage["prompt_tokens"])))
    if show_calls:
        print(f"{'call':>4} {'messages':>8} {'contextlab':>10} {'billed':>7} {'diff':>6} {'ratio':>6}")
    for call, index, ours, billed in rows:
        if show_calls or call in (1, 2, len(rows)) or call % 10 == 0:
            print(f"{call:>4} {index:>8} {ours:>10,} {billed:>7,} {billed - ours:>+6,} {billed / ours:>6.3f}")
    diffs = [billed - ours for _, _, ours, billed in rows]
    ratios = [billed / ours for _, _, ours, billed in rows]
    growth = (diffs[-1] - diffs[0]) / max(len(rows) - 1, 1)
    print(f"{len(rows)} calls: median difference {statistics.median(diffs):+,.0f} tokens, largest absolute "
          f"{max(abs(d) for d in diffs):,}, median ratio {statistics.median(ratios):.3f}; the difference is "
          f"{diffs[0]:+,} on the first call and grows {growth:+.1f} tokens per call")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", action="store_true", help="print every OpenHands call")
    args = parser.parse_args()
    copaw_requests()
    openhands_against_usage(args.calls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
