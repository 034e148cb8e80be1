"""SQLite write transactions of one process take turns in the order they asked."""

from __future__ import annotations

import threading
import time

from django.db import connections

from contextlab.db.sqlite3.base import WriterQueue


def test_it_hands_the_write_turn_to_waiters_in_arrival_order():
    queue = WriterQueue()
    assert queue.acquire(1)
    order: list[int] = []
    arrived: list[threading.Event] = []

    def writer(number: int, ready: threading.Event) -> None:
        ready.set()
        assert queue.acquire(10)
        order.append(number)
        queue.release()

    threads = []
    for number in range(6):
        ready = threading.Event()
        arrived.append(ready)
        thread = threading.Thread(target=writer, args=(number, ready))
        thread.start()
        ready.wait(5)
        # Queued behind the ones before it (a condition wait, not a poll).
        deadline = time.monotonic() + 5
        while len(queue._waiting) < number + 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        threads.append(thread)
    queue.release()
    for thread in threads:
        thread.join(10)
    assert order == list(range(6))


def test_it_gives_up_waiting_after_the_timeout_and_lets_the_next_one_go():
    queue = WriterQueue()
    assert queue.acquire(1)
    assert queue.acquire(0.05) is False
    assert not queue._waiting
    queue.release()
    assert queue.acquire(0.05)


def test_it_is_the_backend_of_an_sqlite_database():
    if connections["default"].vendor == "sqlite":
        assert type(connections["default"]).__module__ == "contextlab.db.sqlite3.base"
