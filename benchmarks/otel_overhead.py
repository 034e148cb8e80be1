"""What exporting a turn as OpenTelemetry spans adds to the turn.

A real hook turn (one user message and one tool round appended, then the hook,
on a session of 200 messages) is timed with export off, and then with export on
to a local OTLP/HTTP receiver, interleaved in one run. With export on, each
turn's span tree (the turn and one child span per decision step) is built and
handed to the batch processor; the export itself happens on the processor's own
thread. The goal is < 1 ms added per turn.

Run: ``.venv/bin/python benchmarks/otel_overhead.py`` (``--turns N``).
Figures are medians and p95 of the per-turn time; the difference is the cost.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.hook_overhead import build, synthetic_round  # noqa: E402
from contextlab.support import telemetry  # noqa: E402
from tests.telemetry.collector import Collector  # noqa: E402


def _p95(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.95) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=400)
    args = parser.parse_args()
    off: list[float] = []
    on: list[float] = []
    span_only: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, Collector() as collector:
        manager = build(200, Path(tmp))
        telemetry.configure(collector.http_endpoint)
        for i in range(args.turns):
            exporting = i % 2 == 1
            start = time.perf_counter()
            manager.append(synthetic_round(10_000 + i))
            result = manager.prepare()
            middle = time.perf_counter()
            if exporting:
                telemetry.record_turn(result.trace.to_dict(), session_id="benchmark")
            end = time.perf_counter()
            (on if exporting else off).append((end - start) * 1000)
            if exporting:
                span_only.append((end - middle) * 1000)
        telemetry.flush()
        received = len(collector.spans("contextlab.turn"))
        telemetry.disable()
    print(f"turns: {len(off)} with export off, {len(on)} with export on (interleaved); "
          f"{received} turn spans received by the local collector")
    print(f"turn, export off : p50 {statistics.median(off):7.3f} ms   p95 {_p95(off):7.3f} ms")
    print(f"turn, export on  : p50 {statistics.median(on):7.3f} ms   p95 {_p95(on):7.3f} ms")
    print(f"span tree per turn (trace to spans, handed to the batch processor): "
          f"p50 {statistics.median(span_only):.3f} ms   p95 {_p95(span_only):.3f} ms   (goal < 1 ms)")


if __name__ == "__main__":
    main()
