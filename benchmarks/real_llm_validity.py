"""How often a real small model's summary passes the validity check, with and without constrained output.

Starts llama.cpp's ``llama-server`` with SmolLM2-135M-Instruct (installed by
scripts/install_real_llm.py; compiled once per machine) and asks the openai
compactor for summaries of slices of the shared corpus's real transcripts,
once per slice in each mode of the profile's ``compaction_constrained_output``
knob: ``off`` (free text), ``grammar`` (GBNF) and ``json_schema``.

Printed per mode: calls, replies the validity check accepts, replies cut at
max_tokens, and the median and p95 call time. A valid reply here means the six
headings are present, not that the text under them is any good: this model
cannot summarise, and nothing here measures quality.

Run: ``.venv/bin/python benchmarks/real_llm_validity.py`` (``--slices 3`` for a short run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import install_real_llm  # noqa: E402

from contextlab.engine.compactors.base import SummaryFailed, SummaryRequest  # noqa: E402
from contextlab.engine.compactors.openai_compat import OpenAICompactor  # noqa: E402
from contextlab.engine.core.messages import Message  # noqa: E402
from contextlab.engine.core.profile import CONSTRAINED_OUTPUTS  # noqa: E402
from contextlab.engine.core.tokens import TiktokenCounter  # noqa: E402
from contextlab.engine.importers import load_transcript  # noqa: E402
from contextlab.engine.stages.summary.validity import check_summary  # noqa: E402
from tests.corpus import TRANSCRIPTS, corpus_path  # noqa: E402
from tests.real_llm.server import LlamaServer, RecordingProxy  # noqa: E402


def slices(count: int, cap_tokens: int) -> list[list[Message]]:
    """Up to ``count`` slices of real transcripts, each at most about ``cap_tokens`` tokens."""
    counter = TiktokenCounter("o200k_base")
    found: list[list[Message]] = []
    for relative in TRANSCRIPTS:
        messages = load_transcript(corpus_path(relative)).messages
        chunk: list[Message] = []
        used = 0
        for message in messages:
            tokens = counter.count_message(message)
            if chunk and used + tokens > cap_tokens:
                break
            chunk.append(message)
            used += tokens
        if any(m.role == "user" for m in chunk):
            found.append(chunk)
        if len(found) == count:
            break
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slices", type=int, default=8, help="transcript slices per mode (default 8)")
    parser.add_argument("--max-tokens", type=int, default=400, help="max_tokens of each summary call")
    parser.add_argument("--cap-tokens", type=int, default=1_500, help="transcript tokens per slice")
    args = parser.parse_args()

    binary, model = install_real_llm.install()
    requests = [SummaryRequest(chunk, None, "en", cap_tokens=args.cap_tokens)
                for chunk in slices(args.slices, args.cap_tokens)]
    with tempfile.TemporaryDirectory() as tmp:
        server = LlamaServer(binary, model, Path(tmp) / "server.log", predict_tokens=args.max_tokens,
                             context_tokens=8192)
        server.start()
        proxy = RecordingProxy(server.port)
        proxy.start()
        try:
            print(f"llama-server from {binary.parents[2].name}, model {model.name}, {len(requests)} slices, "
                  f"max_tokens {args.max_tokens}\n")
            print(f"{'mode':<12} {'calls':>5} {'valid':>5} {'rate':>6} {'cut':>4} {'failed':>6} "
                  f"{'p50 s':>6} {'p95 s':>6}")
            for mode in CONSTRAINED_OUTPUTS:
                compactor = OpenAICompactor(proxy.base_url, "smollm2", api_key_env="", timeout=300, retries=0,
                                            max_tokens=args.max_tokens, constrained_output=mode)
                valid = cut = failed = 0
                seconds: list[float] = []
                for request in requests:
                    proxy.clear()
                    try:
                        result = compactor.summarize(request)
                    except SummaryFailed:
                        failed += 1
                        continue
                    [exchange] = proxy.completions
                    seconds.append(exchange.seconds)
                    cut += exchange.finish_reason == "length"
                    valid += check_summary(result.text, language="en").valid
                calls = len(requests)
                p95 = sorted(seconds)[max(0, int(len(seconds) * 0.95) - 1)] if seconds else 0.0
                print(f"{mode:<12} {calls:>5} {valid:>5} {valid / calls:>6.0%} {cut:>4} {failed:>6} "
                      f"{statistics.median(seconds) if seconds else 0:>6.1f} {p95:>6.1f}", flush=True)
        finally:
            proxy.stop()
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
