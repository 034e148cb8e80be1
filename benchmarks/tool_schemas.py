"""How many prompt tokens the tool definitions of real requests cost.

Reads the request bodies a real CoPaw 1.0.2 agent sent (the shared corpus'
``copaw-1.0.2/requests``) and prints, per distinct tool set, the layer as
``contextlab.engine.schemas`` counts it (OpenAI's per-item formula, o200k_base)
beside the tokens of the same definitions as plain JSON and the messages'
own count, to show what a messages-only count misses.

The corpus holds no usage an OpenAI model reported for these bodies (the run
used a local fake model), so the formula itself is not re-measured here; the
module docstring of ``schemas.py`` says where its constants come from.

Run: ``.venv/bin/python benchmarks/tool_schemas.py``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contextlab.engine.convert.openai import from_openai  # noqa: E402
from contextlab.engine.schemas import tool_tokens  # noqa: E402
from contextlab.engine.tokens import TiktokenCounter  # noqa: E402
from tests.corpus import SHARED  # noqa: E402

REQUESTS = SHARED / "corpus" / "copaw-1.0.2" / "requests"


def main() -> int:
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
