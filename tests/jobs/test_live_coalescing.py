"""Full-state events are coalesced to about ten a second per session, latest wins."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from contextlab.support import live


def test_it_sends_the_first_at_once_and_only_the_latest_of_a_burst(viewer):
    page = viewer("coalesce-1")
    for n in range(50):
        live.publish(page.group, {"type": "gauge.update", "n": n}, coalesce="gauge")
    events = page.events()
    assert [e["n"] for e in events] == [0, 49]


def test_it_keeps_keys_and_groups_apart(viewer):
    a, b = viewer("coalesce-a"), viewer("coalesce-b")
    for n in range(5):
        live.publish(a.group, {"type": "gauge.update", "n": n}, coalesce="gauge")
        live.publish(a.group, {"type": "run.update", "n": n}, coalesce="run-1")
        live.publish(b.group, {"type": "gauge.update", "n": n}, coalesce="gauge")
    got_a = a.events()
    assert [(e["type"], e["n"]) for e in got_a if e["type"] == "gauge.update"] == [("gauge.update", 0),
                                                                                  ("gauge.update", 4)]
    assert [e["n"] for e in got_a if e["type"] == "run.update"] == [0, 4]
    assert [e["n"] for e in b.events()] == [0, 4]


def test_it_sends_the_pending_state_by_itself_within_the_interval(viewer):
    page = viewer("coalesce-2")
    live.publish(page.group, {"type": "gauge.update", "n": 1}, coalesce="gauge")
    live.publish(page.group, {"type": "gauge.update", "n": 2}, coalesce="gauge")
    time.sleep(live.COALESCE_SECONDS * 3)  # no flush(): the timer sends it
    assert [e["n"] for e in page.events()] == [1, 2]


class SteppedTime:
    """A clock the test moves forward, firing the timers that fall due on the way."""

    def __init__(self) -> None:
        self.now = 1_000.0
        self._due: list[tuple[float, Callable[[], None], list[bool]]] = []

    def __call__(self) -> float:
        return self.now

    def schedule(self, delay: float, action: Callable[[], None]) -> Any:
        cancelled = [False]
        self._due.append((self.now + delay, action, cancelled))

        class Handle:
            def cancel(self) -> None:
                cancelled[0] = True

        return Handle()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [entry for entry in self._due if entry[0] <= self.now]
        self._due = [entry for entry in self._due if entry[0] > self.now]
        for _, action, cancelled in sorted(due, key=lambda entry: entry[0]):
            if not cancelled[0]:
                action()


def test_it_stays_at_about_ten_a_second_under_a_steady_stream():
    clock = SteppedTime()
    sent: list[tuple[float, dict[str, Any]]] = []
    coalescer = live.Coalescer(live.COALESCE_SECONDS, clock=clock, schedule=clock.schedule,
                               send=lambda group, event: sent.append((clock.now, event)))
    n = 200  # one second of an update every 5 ms
    for i in range(n):
        coalescer.offer("session-x", "gauge", {"type": "gauge.update", "n": i})
        clock.advance(0.005)
    stamps = [at for at, _ in sent]  # what the timers sent, before the final flush
    coalescer.flush_all()
    assert 10 <= len(sent) <= 11
    assert sent[-1][1]["n"] == n - 1
    assert min(b - a for a, b in zip(stamps, stamps[1:], strict=False)) >= live.COALESCE_SECONDS - 1e-9
