"""Server render time of the session page on a 10,000-message session.

Builds the session through the services (the extractive compactor, a 16,000-token
window so compaction fires every few turns, 48 messages appended before each
hook run), then times, with the Django test client:

* the whole session page;
* each fragment alone, as the websocket pushes it (``render_fragments``);
* the htmx endpoints a viewer clicks (a turn's flow, a page of the message
  list far in the past, the ledger, the payload of an old turn), the summary
  diff viewer and a search.

Every figure is the median of ``--repeat`` runs after one warm-up. The point is
that none of them grows with the session: every list is a page or a window.

Run: ``.venv/bin/python benchmarks/session_page.py`` (``--messages 2000`` for a
short run; ``--keep DIR`` keeps the database and workspaces).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import isolated_django  # noqa: E402


def _median_ms(function: Callable[[], object], repeat: int) -> float:
    function()  # warm-up: template loading, first queries
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--keep", type=Path, help="keep the database and workspaces in this folder")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="contextlab-bench-page-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        isolated_django.setup(folder)
        _run(args.messages, args.repeat)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


def _build(messages: int) -> object:
    from django.contrib.auth.models import User

    from contextlab.sessions import services
    from tests.conversations import answer, tool_turn

    owner = User.objects.create_user("bench", "bench@example.org", "bench")
    profile = services.profile_create(owner=owner, name="bench-16k", knobs={
        "max_input_length": 16_000, "recent_n": 3, "recent_max_bytes": 2_000, "old_max_bytes": 400})
    session = services.session_create(owner=owner, system_prompt="You are a careful build agent.",
                                      profile=profile, title="10,000 messages")
    start = time.perf_counter()
    i = 0
    while session.messages_count < messages:
        batch: list[dict[str, object]] = []
        for _ in range(12):
            i += 1
            batch += [*([answer(i - 1)] if i > 1 else []), *tool_turn(i, output_bytes=1_200)]
        services.messages_append(session=session, messages=batch)
        services.session_prepare(session=session)
        session.refresh_from_db()
        if session.turns_count % 25 == 0:
            print(f"  … {session.messages_count:,} messages, {session.turns_count} turns", flush=True)
    print(f"built {session.messages_count:,} messages, {session.turns_count} turns, "
          f"{session.compactions_count} compactions, {session.offloaded_files.count():,} offloaded files "
          f"in {time.perf_counter() - start:.0f} s")
    return session


def _run(messages: int, repeat: int) -> None:
    from django.test import Client

    from contextlab.dashboard import fragments
    from contextlab.sessions.models import AgentSession, Turn

    session = _build(messages)
    assert isinstance(session, AgentSession)
    client = Client()
    client.force_login(session.owner)
    base = session.get_absolute_url()
    old_turn = Turn.objects.filter(session=session, outcome="compacted").order_by("number").first()
    assert old_turn is not None
    far_page = session.messages_count // fragments.MESSAGES_PER_PAGE // 2

    def get(url: str) -> Callable[[], object]:
        def fetch() -> object:
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)
            return response
        return fetch

    rows: list[tuple[str, float]] = [("session page (whole)", _median_ms(get(base), repeat))]
    live = AgentSession.objects.select_related("profile").defer("engine_state").get(pk=session.pk)
    for name in fragments.FRAGMENTS:
        rows.append((f"fragment {name}", _median_ms(lambda name=name: fragments.render_fragments(live, [name]),
                                                    repeat)))
    rows.append(("push after a turn (all fragments)",
                 _median_ms(lambda: fragments.render_fragments(live, fragments.KINDS["turn"]), repeat)))
    rows.append(("push after an append", _median_ms(
        lambda: fragments.render_fragments(live, fragments.KINDS["messages"]), repeat)))
    rows += [
        (f"flow + LLM view of turn {old_turn.number}", _median_ms(get(f"{base}inspect/?turn={old_turn.number}"),
                                                                   repeat)),
        (f"every panel at turn {old_turn.number} (time travel)",
         _median_ms(get(f"{base}at/?turn={old_turn.number}"), repeat)),
        ("every panel, back to the latest", _median_ms(get(f"{base}at/?turn=latest"), repeat)),
        (f"message list, page {far_page:,}", _median_ms(get(f"{base}messages/?page={far_page}"), repeat)),
        ("truncation ledger, page 2", _median_ms(get(f"{base}ledger/?page=2"), repeat)),
        ("turn catch-up (?after=N-5)", _median_ms(get(f"{base}turns/?after={session.turns_count - 5}"), repeat)),
        ("summary diff viewer (latest)", _median_ms(get(f"{base}summaries/"), repeat)),
        ("search (a path in 25 messages)", _median_ms(get(f"{base}search?q=/srv/app/t17.log"), repeat)),
    ]
    print(f"\nmedian of {repeat} after a warm-up, {session.messages_count:,} messages:")
    width = max(len(name) for name, _ in rows)
    for name, ms in rows:
        print(f"  {name:<{width}}  {ms:8.1f} ms")


if __name__ == "__main__":
    main()
