"""Cost of one API turn of an agent, embedded mode, as the live context grows.

One turn is what an agent does between two LLM calls: ``POST …/messages`` with
the assistant's answer, a new user message, a tool call and its result, then
``POST …/prepare`` for the next payload. The window is large enough that nothing
ever compacts, so the figure is the web tier's own cost around the engine. Beside
each size:

* the JSON floor: encoding the prepare response's payload and decoding it, which
  no design can avoid (the payload is the answer);
* the cold turn: the same turn when this process holds no engine for the
  session (a restarted process, or another process committed last), i.e. the
  engine rebuilt from the database.

Run: ``.venv/bin/python benchmarks/api_turn.py`` (``--sizes 100 1000`` for a
short run; ``--turns`` timed turns per size). Prints p50/p95 in milliseconds,
and the turn's CPU time (this process's, p50): on a machine other work keeps
busy the wall clock also counts the waits for a core, the CPU time does not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import isolated_django  # noqa: E402


def _exchange(i: int) -> list[dict[str, Any]]:
    """Four messages: the answer to the previous step, a user ask, a tool call and its result."""
    call_id = f"call_{i}"
    return [
        {"role": "assistant", "content": f"Step {i - 1} is done: the build of t{i - 1} passed."},
        {"role": "user", "content": f"Step {i}: build target t{i} and report the errors in /srv/app/t{i}.log"},
        {"role": "assistant", "content": f"Building t{i}.",
         "tool_calls": [{"id": call_id, "type": "function",
                         "function": {"name": "run_shell", "arguments": json.dumps({"command": f"make t{i}"})}}]},
        {"role": "tool", "tool_call_id": call_id,
         "content": "\n".join(f"[t{i}] compiled module_{n:02d}.c in {n % 13 + 1} ms" for n in range(6))},
    ]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 5_000])
    parser.add_argument("--turns", type=int, default=30, help="timed turns per size")
    parser.add_argument("--cold", type=int, default=5, help="timed cold turns per size")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="contextlab-api-turn-"))
    try:
        isolated_django.setup(folder)
        _run(args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(args: argparse.Namespace) -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    from contextlab.api.models import ApiToken
    from contextlab.sessions import services
    from contextlab.sessions.services.persistence import engines

    user = User.objects.create_user("bench", "bench@example.org", "bench-password")
    token = ApiToken.issue(user=user, name="bench")[1]
    headers = {"Authorization": f"Bearer {token}"}
    client = Client()
    # Nothing compacts and nothing is cut: the web tier's cost, not the engine's work.
    profile = services.profile_create(owner=user, name="wide", knobs={
        "max_input_length": 10_000_000, "recent_max_bytes": 100_000, "old_max_bytes": 100_000})

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = client.post(path, json.dumps(body), content_type="application/json", headers=headers)
        assert response.status_code in (200, 201), response.content[:500]
        return json.loads(response.content)

    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"{'live msgs':>9} | {'turn p50':>8} {'p95':>7} {'CPU p50':>7} | {'JSON floor':>10} | {'above floor':>11} "
          f"{'CPU':>5} | {'cold p50':>8} {'p95':>7} {'CPU p50':>7}")
    baseline: float | None = None
    baseline_wall: float | None = None
    for size in args.sizes:
        session = services.session_create(owner=user, system_prompt="You are a careful coding agent.",
                                          profile=profile, title=f"{size} messages")
        base = f"/api/v1/sessions/{session.pk}"
        step = 0
        batch: list[dict[str, Any]] = []
        while step * 4 < size - 1:
            step += 1
            batch.extend(_exchange(step)[1:] if step == 1 else _exchange(step))
            if len(batch) >= 400:
                services.messages_append_openai(session=session, messages=batch)
                batch = []
        if batch:
            services.messages_append_openai(session=session, messages=batch)
        post(f"{base}/prepare", {})
        steps = iter(range(step + 1, step + 10_000))

        def turn(base: str = base, steps: Any = steps) -> dict[str, Any]:
            post(f"{base}/messages", {"messages": _exchange(next(steps))})
            return post(f"{base}/prepare", {})

        turn()  # warm-up
        times: list[float] = []
        cpu: list[float] = []
        floors: list[float] = []
        live = 0
        for _ in range(args.turns):
            start, start_cpu = time.perf_counter(), time.process_time()
            answer = turn()
            times.append((time.perf_counter() - start) * 1000)
            cpu.append((time.process_time() - start_cpu) * 1000)
            live = len(answer["messages"])
            start = time.process_time()
            json.loads(json.dumps(answer["messages"]))
            floors.append((time.process_time() - start) * 1000)
        cold: list[float] = []
        cold_cpu: list[float] = []
        for _ in range(args.cold):
            engines.clear()
            start, start_cpu = time.perf_counter(), time.process_time()
            turn()
            cold.append((time.perf_counter() - start) * 1000)
            cold_cpu.append((time.process_time() - start_cpu) * 1000)
        p50, p50_cpu, floor = statistics.median(times), statistics.median(cpu), statistics.median(floors)
        baseline = baseline or p50_cpu
        print(f"{live:>9,} | {p50:>8.1f} {_pct(times, 0.95):>7.1f} {p50_cpu:>7.1f} | {floor:>10.1f} | "
              f"{p50 - floor:>11.1f} {p50_cpu - floor:>5.1f} | {statistics.median(cold):>8.1f} "
              f"{_pct(cold, 0.95):>7.1f} {statistics.median(cold_cpu):>7.1f}   "
              f"(CPU ratio to the first size {p50_cpu / baseline:.2f}, wall {p50 / (baseline_wall or p50):.2f})")
        baseline_wall = baseline_wall or p50


if __name__ == "__main__":
    main()
