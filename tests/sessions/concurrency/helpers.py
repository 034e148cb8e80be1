"""What the concurrency tests share: a valid summary the fake model answers with,
how long a step of traffic may take, and work in a thread that reports its error."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

SUMMARY = ("## Goal\n- build every target\n## Constraints & Preferences\n- none\n## Progress\n### Done\n- t1\n"
           "### In Progress\n- t2\n### Blocked\n- none\n## Key Decisions\n- use make\n## Next Steps\n- t3\n"
           "## Critical Context\n- /srv/app/t1.log\n")
# Every step of the traffic must finish well within this while the summary call is held open;
# a step that waited for the compaction's lock would wait until the gate opens, after it.
STEP_LIMIT_SECONDS = 60


def in_thread(work: Callable[[], Any], errors: list[BaseException]) -> threading.Thread:
    """Start ``work`` in a thread with its own database connections; an exception lands in ``errors``."""
    def run() -> None:
        try:
            work()
        except BaseException as exc:  # reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread
