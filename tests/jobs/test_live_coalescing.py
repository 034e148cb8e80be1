"""Full-state events are coalesced to about ten a second per session, latest wins."""

from __future__ import annotations

import time

from contextlab import live


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


def test_it_stays_at_about_ten_a_second_under_a_steady_stream(viewer):
    page = viewer("coalesce-3")
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < 1.0:
        live.publish(page.group, {"type": "gauge.update", "n": n}, coalesce="gauge")
        n += 1
        time.sleep(0.005)
    events = page.events()
    assert n > 100
    assert 8 <= len(events) <= 13
    assert events[-1]["n"] == n - 1
    stamps = [e["sent_at"] for e in events]
    assert min(b - a for a, b in zip(stamps, stamps[1:], strict=False)) > live.COALESCE_SECONDS * 0.8
