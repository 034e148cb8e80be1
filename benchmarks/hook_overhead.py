"""Per-turn cost of the pre-reasoning hook, without the LLM call.

Two figures:

* **warm turn** against session length (200, 2,000 and 10,000 messages): one
  user message and one tool round are appended, then the hook runs. Token counts
  are exact (tiktoken o200k_base) and cached per message, so a turn should cost
  about the same whatever the session length.
* **cold recount**: counting every message of a real session from scratch,
  against raw ``tiktoken`` ``encode`` of the same text.

Run: ``.venv/bin/python benchmarks/hook_overhead.py`` (add ``--quick`` for a
short run). Figures are medians; the ratios are what to compare across machines.
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

from contextlab.engine.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock  # noqa: E402
from contextlab.engine.core.profile import Profile  # noqa: E402
from contextlab.engine.core.tokens import TiktokenCounter, get_encoding  # noqa: E402
from contextlab.engine.hook import ContextManager  # noqa: E402

CORPUS = REPO.parent / "shared" / "corpus" / "raw"


def synthetic_round(i: int) -> list[Message]:
    call = ToolUseBlock(id=f"call-{i}", name="bash", input={"command": f"pytest tests/test_{i % 50}.py -q"})
    output = "".join(f"tests/test_{i % 50}.py::test_case_{k} PASSED [{k}%]\n" for k in range(40))
    return [
        Message.text("user", f"Step {i}: run the tests of module {i % 50} and fix what fails.", id=f"u-{i}"),
        Message(role="assistant", content=(TextBlock("Running the tests."), call), id=f"a-{i}"),
        Message(role="tool", content=(ToolResultBlock(id=call.id, name="bash", output=output),), id=f"t-{i}"),
    ]


def build(length: int, workspace: Path) -> ContextManager:
    # A window large enough that no compaction fires: the figure is the hook's
    # own overhead (gate, stage 2, context check, payload), not an LLM call.
    profile = Profile(max_input_length=10_000_000, compact_ratio=0.9, reserve_ratio=0.05)
    manager = ContextManager(profile, workspace, system_prompt="You are a careful coding agent. " * 20)
    batch: list[Message] = []
    i = 0
    while len(batch) < length:
        batch.extend(synthetic_round(i))
        i += 1
    manager.append(batch)  # whole rounds: at most two messages over `length`
    manager.prepare()  # warm: every message counted once
    manager._bench_next = i  # type: ignore[attr-defined]
    return manager


def warm_turns(managers: dict[int, ContextManager], rounds: int, per_round: int) -> dict[int, float]:
    """Median warm-turn time per session length.

    The sizes are measured in interleaved rounds so that a change in machine
    load during the run affects every size alike instead of skewing one.
    """
    samples: dict[int, list[float]] = {length: [] for length in managers}
    for _ in range(rounds):
        for length, manager in managers.items():
            i: int = manager._bench_next  # type: ignore[attr-defined]
            for _ in range(per_round):
                batch = synthetic_round(i)
                i += 1
                start = time.perf_counter()
                manager.append(batch)
                manager.prepare()
                samples[length].append((time.perf_counter() - start) * 1000)
            manager._bench_next = i  # type: ignore[attr-defined]
    return {length: statistics.median(values) for length, values in samples.items()}


def cold_recount(repeat: int) -> tuple[float, float, int]:
    """Raw ``encode`` of exactly the texts our counter encodes, against the counter."""
    from contextlab.engine.importers import load_transcript

    messages = [m for path in sorted(CORPUS.rglob("*")) if path.is_file() and path.name != "LICENSE"
                for m in load_transcript(path).messages]
    planner = TiktokenCounter("o200k_base")
    texts = [t for m in messages for t in planner._plan(m)[1] if t]
    encoding = get_encoding("o200k_base")
    raw_times: list[float] = []
    ours: list[float] = []
    for _ in range(repeat):
        start = time.perf_counter()
        for text in texts:
            encoding.encode_ordinary(text)
        raw_times.append(time.perf_counter() - start)
        fresh = [Message(role=m.role, content=m.content, id=m.id, name=m.name) for m in messages]
        counter = TiktokenCounter("o200k_base")
        start = time.perf_counter()
        counter.count_messages_cold(fresh)
        ours.append(time.perf_counter() - start)
    return statistics.median(raw_times), statistics.median(ours), sum(len(t.encode()) for t in texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds, per_round = (5, 10) if args.quick else (20, 20)
    print(f"warm turn (append 3 messages + hook, no LLM), median of {rounds * per_round} per length")
    with tempfile.TemporaryDirectory() as tmp:
        managers = {length: build(length, Path(tmp) / str(length)) for length in (200, 2_000, 10_000)}
        results = warm_turns(managers, rounds, per_round)
    for length, value in results.items():
        print(f"  {length:>6,} messages: {value:.3f} ms")
    print(f"  ratio 2,000 / 200   = {results[2_000] / results[200]:.2f}x")
    print(f"  ratio 10,000 / 200  = {results[10_000] / results[200]:.2f}x")
    raw, ours, size = cold_recount(3 if args.quick else 7)
    print(f"cold recount of every corpus message ({size / 1e6:.1f} MB of text), median")
    print(f"  raw tiktoken encode: {raw * 1000:.0f} ms")
    print(f"  ContextLab counter : {ours * 1000:.0f} ms")
    print(f"  ratio              = {ours / raw:.2f}x")


if __name__ == "__main__":
    main()
