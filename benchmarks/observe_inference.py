"""Cost of the observe inference over a recorded request log (the shared CoPaw run).

The gateway in observe mode re-reads every recorded call of a profile after each
call, so what matters is one pass over the whole log:

* **cold pass**: the first pass, every message's tokens counted;
* **warm pass**: later passes, token counts cached by message content;
* **no counter**: the inference alone (no traces, no token counts).

Run: ``.venv/bin/python benchmarks/observe_inference.py [REQUESTS_DIR]`` (default:
``../shared/corpus/copaw-1.0.2/requests``). Figures are medians of 5 passes.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contextlab.engine.core.tokens import TiktokenCounter  # noqa: E402
from contextlab.engine.observe import inference as observe  # noqa: E402


def one_pass(requests: list[observe.RecordedRequest], counter: TiktokenCounter | None) -> float:
    started = time.perf_counter()
    observer = observe.Observer(counter=counter)
    for request in requests:
        observer.observe(request)
    return time.perf_counter() - started


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO.parent / "shared" / "corpus" / "copaw-1.0.2" / "requests"
    requests = [observe.load_recorded_request(json.loads(p.read_text(encoding="utf-8")), index)
                for index, p in enumerate(sorted(folder.glob("*.json")), start=1)]
    size = sum(len(json.dumps(r.body)) for r in requests)
    counter = TiktokenCounter()
    observe._TOKEN_CACHE.clear()
    cold = one_pass(requests, counter)
    warm = statistics.median(one_pass(requests, counter) for _ in range(5))
    bare = statistics.median(one_pass(requests, None) for _ in range(5))
    print(f"{len(requests)} requests, {size / 1e6:.1f} MB of request bodies")
    print(f"cold pass (tokens counted):  {cold * 1000:8.0f} ms  ({cold * 1000 / len(requests):.1f} ms/request)")
    print(f"warm pass (counts cached):   {warm * 1000:8.0f} ms  ({warm * 1000 / len(requests):.1f} ms/request)")
    print(f"inference alone (no traces): {bare * 1000:8.0f} ms  ({bare * 1000 / len(requests):.1f} ms/request)")


if __name__ == "__main__":
    main()
