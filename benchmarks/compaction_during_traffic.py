"""Other sessions' latency while one session's summary call takes a long time.

One session goes over its threshold with a summary model (a local fake OpenAI
server) that takes ``--llm-seconds`` to answer; meanwhile ``--sessions`` other
sessions, and the compacting session itself, keep appending a tool exchange
and asking for the next payload, one thread each. Before that, the same traffic
runs for ``--baseline-seconds`` with no compaction anywhere, for comparison.
Prints p50/p95/max per phase and group, the errors (there should be none) and
whether every appended message is in the database exactly once.

Run on SQLite (a temporary file, the default) or on PostgreSQL:
``.venv/bin/python benchmarks/compaction_during_traffic.py --database-url
postgres://…/scratch`` (a scratch database: the benchmark migrates it and writes
to it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SUMMARY = ("## Goal\n- build every target\n## Constraints & Preferences\n- none\n## Progress\n### Done\n- t1\n"
           "### In Progress\n- t2\n### Blocked\n- none\n## Key Decisions\n- use make\n## Next Steps\n- t3\n"
           "## Critical Context\n- /srv/app/t1.log\n")


def _setup(folder: Path, database_url: str | None) -> None:
    os.environ["DATABASE_URL"] = database_url or f"sqlite:///{folder / 'bench.sqlite3'}"
    os.environ["CONTEXTLAB_WORKSPACES_DIR"] = str(folder / "workspaces")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "contextlab.settings")
    os.environ.setdefault("CONTEXTLAB_EMBEDDED_BEAT", "false")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm-seconds", type=float, default=20.0)
    parser.add_argument("--baseline-seconds", type=float, default=10.0)
    parser.add_argument("--sessions", type=int, default=4, help="other sessions taking traffic")
    parser.add_argument("--database-url", default=None, help="a scratch PostgreSQL database (default: SQLite)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="contextlab-compaction-traffic-"))
    try:
        _setup(folder, args.database_url)
        _run(args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(args: argparse.Namespace) -> None:
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.db import connection, connections

    from contextlab.sessions import services
    from contextlab.sessions.models import AgentSession, SessionMessage
    from tests.conversations import answer, tool_turn
    from tests.fakellm import FakeLLM, Reply, Sleep

    suffix = str(time.time_ns())
    user = User.objects.create_user(f"bench-{suffix}", "bench@example.org", "bench-password")
    with FakeLLM([Sleep(args.llm_seconds, Reply(SUMMARY))]) as llm:
        # The operator offers the fake LLM as the provider "fake"; the profile picks it.
        settings.CONTEXTLAB_PROVIDERS = llm.provider
        knobs = {"max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400}
        remote = services.profile_create(owner=user, name="remote", knobs={
            **knobs, "compactor": "openai", "compaction_provider": "fake", "compaction_model": "fake",
            "compaction_timeout": args.llm_seconds + 60, "compaction_retries": 0})
        wide = services.profile_create(owner=user, name="wide", knobs={"max_input_length": 1_000_000})
        compacting = services.session_create(owner=user, system_prompt="You are a coding agent.", profile=remote)
        others = [services.session_create(owner=user, system_prompt="You are a coding agent.", profile=wide)
                  for _ in range(args.sessions)]
        for i in range(1, 17):
            services.messages_append(session=compacting,
                                     messages=[*([answer(i - 1)] if i > 1 else []), *tool_turn(i)])
        steps = {s.pk: 1 for s in [compacting, *others]}
        appended: dict[Any, list[str]] = {s.pk: [] for s in [compacting, *others]}
        errors: list[str] = []
        lock = threading.Lock()

        def traffic(session: AgentSession, until: threading.Event, times: list[float]) -> None:
            try:
                while not until.is_set():
                    with lock:
                        steps[session.pk] += 1
                        i = steps[session.pk] + 100
                    start = time.perf_counter()
                    try:
                        rows = services.messages_append(session=session, messages=[answer(i - 1), *tool_turn(
                            i, output_bytes=300)])
                        appended[session.pk].extend(r.message_id for r in rows)
                        services.session_prepare(session=session)
                    except Exception as exc:  # counted, never hidden
                        errors.append(f"{type(exc).__name__}: {exc}")
                    times.append((time.perf_counter() - start) * 1000)
            finally:
                connections.close_all()

        def phase(name: str, sessions: list[AgentSession], work: Any = None) -> None:
            until = threading.Event()
            times: dict[Any, list[float]] = {s.pk: [] for s in sessions}
            threads = [threading.Thread(target=traffic, args=(s, until, times[s.pk])) for s in sessions]
            started = time.perf_counter()
            worker = threading.Thread(target=work) if work is not None else None
            if worker is not None:
                # The traffic starts once the summary call is in flight.
                worker.start()
                while not llm.requests and worker.is_alive():
                    time.sleep(0.01)
            for thread in threads:
                thread.start()
            if worker is None:
                time.sleep(args.baseline_seconds)
            else:
                worker.join()
            elapsed = time.perf_counter() - started
            until.set()
            for thread in threads:
                thread.join()
            other = [t for s in sessions if s.pk != compacting.pk for t in times[s.pk]]
            same = times.get(compacting.pk, [])
            print(f"{name} ({elapsed:.1f} s):")
            print(f"  other sessions: {len(other)} turns, p50 {statistics.median(other):.1f} ms, "
                  f"p95 {_pct(other, 0.95):.1f} ms, max {max(other):.1f} ms")
            if same:
                print(f"  compacting session: {len(same)} turns, p50 {statistics.median(same):.1f} ms, "
                      f"p95 {_pct(same, 0.95):.1f} ms, max {max(same):.1f} ms")

        print(f"{connection.vendor}, {args.sessions} other sessions, summary call {args.llm_seconds:.0f} s")
        phase("no compaction anywhere", others)

        def compaction() -> None:
            try:
                _, trace = services.session_prepare(session=compacting)
                print(f"  the compaction: turn {trace['turn']} {trace['outcome']}")
            except Exception as exc:  # counted, never hidden
                errors.append(f"the compaction: {type(exc).__name__}: {exc}")
            finally:
                connections.close_all()

        phase("one session's summary call in flight", [compacting, *others], compaction)
        lost = duplicated = 0
        for session in [compacting, *others]:
            ids = list(SessionMessage.objects.filter(session=session).values_list("message_id", flat=True))
            lost += len(set(appended[session.pk]) - set(ids))
            duplicated += len(ids) - len(set(ids))
        print(f"errors {len(errors)}, lost {lost}, duplicated {duplicated}")
        for error in errors[:5]:
            print("  ", error)


if __name__ == "__main__":
    main()
