"""How often each policy compacts, and whether it ever overflows or loses a message.

Every transcript of the shared corpus is replayed at windows of 8,000, 16,000
and 32,000 tokens under the ``copaw`` and ``contextlab`` policies (``--eviction``
adds the three eviction strategies). For each run:

* **compactions**: turns whose outcome is a compaction (or an eviction);
* **over**: turns whose payload (exact tiktoken count, as sent) is larger than
  the window. CoPaw's overshoot is its faithful reproduction and is shown,
  not fixed;
* **lost**: input messages that are neither live, archived nor externalized
  with their original content (``contextlab.engine.replay.verify``).

The goal for ``contextlab`` is: compactions ≤ CoPaw's on every row, 0 over,
0 lost. Run: ``.venv/bin/python benchmarks/compaction_count.py`` (``--quick``
replays the 8,000 window only; ``--only NAME`` keeps transcripts whose path
contains NAME; ``--generated`` replays the corpus built to make the claim hard,
``tests/engine/hard_corpus.py``, instead of the shared one).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contextlab.engine.core.profile import Profile  # noqa: E402
from contextlab.engine.importers import load_transcript  # noqa: E402
from contextlab.engine.replay.transcript import replay_transcript  # noqa: E402
from contextlab.engine.replay.verify import verify_replay  # noqa: E402
from tests.corpus import TRANSCRIPTS, corpus_path  # noqa: E402
from tests.engine.hard_corpus import SCENARIOS, write_transcript  # noqa: E402

WINDOWS = (8_000, 16_000, 32_000)
BASE_VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("copaw", {"policy": "copaw"}),
    ("contextlab", {"policy": "contextlab"}),
)
EVICTION_VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = tuple(
    (f"ev:{strategy}", {"policy": "eviction", "eviction_strategy": strategy})
    for strategy in ("lowest_score_first", "sliding_window", "hierarchical_quota"))


def run(relative: str, window: int, changes: dict[str, Any], folder: Path) -> dict[str, int]:
    path = Path(relative) if Path(relative).is_absolute() else corpus_path(relative)
    profile = Profile(max_input_length=window).replace(**changes)
    report = replay_transcript(path, folder, profile=profile, overwrite=True)
    over = 0
    peak = 0
    totals: list[int] = []
    for line in (folder / "trace.jsonl").read_bytes().decode("utf-8").splitlines():
        total = int(json.loads(line)["payload"]["tokens"]["total"])
        totals.append(total)
        peak = max(peak, total)
        over += total > window
    lost = verify_replay(folder, load_transcript(path).messages)
    return {"compactions": report.compactions + report.evictions, "over": over, "peak": peak,
            "lost": len(lost.missing) + len(lost.changed), "turns": report.turns,
            "mean_share": sum(totals) / len(totals) / window if totals else 0.0}


def short(relative: str) -> str:
    parts = Path(relative).parts
    name = parts[-1] if parts[-1] not in ("thread.json",) else parts[-2]
    return f"{parts[0]}/{name[:28]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the 8,000-token window only")
    parser.add_argument("--eviction", action="store_true", help="add the three eviction strategies")
    parser.add_argument("--only", default="", help="transcripts whose path contains this")
    parser.add_argument("--generated", action="store_true", help="the generated hard corpus instead")
    args = parser.parse_args()
    windows = WINDOWS[:1] if args.quick else WINDOWS
    variants = BASE_VARIANTS + (EVICTION_VARIANTS if args.eviction else ())
    transcripts = [t for t in TRANSCRIPTS if args.only in t]
    if args.generated:
        return generated(windows, variants, args.only)
    print(f"machine: {platform.machine()}, {platform.system()}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPU(s)\n")
    columns = ["transcript", "window", "turns"]
    for name, _ in variants:
        columns += [f"{name} compactions", f"{name} over", f"{name} lost"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|")
    at_most_copaw = rows = over_total = lost_total = 0
    compactions_total: dict[str, int] = {name: 0 for name, _ in variants}
    # What fewer compactions cost: the payload's mean share of the window over the turns of a run,
    # on the rows that need compaction at all (CoPaw compacts there), the same rows for every policy.
    shares: dict[str, list[float]] = {name: [] for name, _ in variants}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for relative in transcripts:
            for window in windows:
                results = {name: run(relative, window, changes, Path(tmp) / f"{name}-{window}")
                           for name, changes in variants}
                cells = [short(relative), f"{window:,}", str(results["copaw"]["turns"])]
                for name, _ in variants:
                    r = results[name]
                    cells += [str(r["compactions"]), str(r["over"]), str(r["lost"])]
                print("| " + " | ".join(cells) + " |", flush=True)
                rows += 1
                at_most_copaw += results["contextlab"]["compactions"] <= results["copaw"]["compactions"]
                for name, r in results.items():
                    compactions_total[name] += r["compactions"]
                    if results["copaw"]["compactions"]:
                        shares[name].append(r["mean_share"])
                    if name != "copaw":
                        over_total += r["over"]
                        lost_total += r["lost"]
    print(f"\ncontextlab compactions ≤ copaw on {at_most_copaw}/{rows} rows; over-window turns (all policies "
          f"but copaw): {over_total}; lost messages (all policies but copaw): {lost_total}; "
          f"{time.perf_counter() - started:.0f} s")
    for name, _ in variants:
        mean = sum(shares[name]) / len(shares[name]) if shares[name] else 0.0
        print(f"{name}: {compactions_total[name]} compactions in all; payload's mean share of the window, "
              f"averaged over the rows where CoPaw compacts: {mean:.0%}")
    return 0


def generated(windows: tuple[int, ...], variants: tuple[tuple[str, dict[str, Any]], ...], only: str) -> int:
    """The generated corpus: one transcript per scenario and window (each is made for its window)."""
    print("| scenario | window | turns | " + " | ".join(f"{name} compactions | {name} over" for name, _ in variants)
          + " | contextlab ≤ copaw |")
    print("|---|---:|---:|" + "---:|---:|" * len(variants) + "---|")
    rows = held = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in (n for n in SCENARIOS if only in n):
            for window in windows:
                path = write_transcript(name, window, Path(tmp))
                results = {v: run(str(path), window, changes, Path(tmp) / f"{v}-{name}-{window}")
                           for v, changes in variants}
                ours, theirs = results["contextlab"]["compactions"], results["copaw"]["compactions"]
                # A turn where CoPaw sends more than the window is a compaction it skipped by breaking
                # the window; a policy bound by the window may compact there (as the test allows).
                ok = ours <= theirs + results["copaw"]["over"]
                verdict = "yes" if ours <= theirs else f"yes (CoPaw over the window {results['copaw']['over']}×)" \
                    if ok else "NO"
                rows, held = rows + 1, held + ok
                print(f"| {name} | {window:,} | {results['copaw']['turns']} | "
                      + " | ".join(f"{results[v]['compactions']} | {results[v]['over']}" for v, _ in variants)
                      + f" | {verdict} |", flush=True)
    print(f"\ncontextlab compactions ≤ copaw on {held}/{rows} rows")
    return 0 if held == rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
