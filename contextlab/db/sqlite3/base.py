"""SQLite with the process's write transactions taken in turn, first come first served.

SQLite has one writer at a time. A transaction that finds the write lock taken
waits in SQLite's busy handler, which polls with growing sleeps (up to 100 ms)
and serves nobody in order: under steady traffic from a few threads, one of
them could keep losing the race until its 10 s busy timeout ran out and the
request failed with "database is locked". Here a write transaction of this
process first queues for its turn (a FIFO of the threads waiting, woken as soon
as the writer before them commits), so SQLite's own wait only ever arbitrates
between processes.

The queue waits at most the busy timeout; past that the transaction goes ahead
and SQLite's handler decides, so a thread can never wait on the queue forever.
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Any

from django.db.backends.sqlite3 import base

# As long as the busy timeout in the settings' init_command.
QUEUE_TIMEOUT_SECONDS = 10.0


class WriterQueue:
    """A lock handed to its waiters in the order they asked for it."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._waiting: collections.deque[object] = collections.deque()
        self._held = False

    def acquire(self, timeout: float) -> bool:
        ticket = object()
        with self._condition:
            self._waiting.append(ticket)
            got = self._condition.wait_for(lambda: not self._held and self._waiting[0] is ticket, timeout)
            if got:
                self._waiting.popleft()
                self._held = True
            else:
                self._waiting.remove(ticket)
                self._condition.notify_all()  # the next in line may be free to go now
            return got

    def release(self) -> None:
        with self._condition:
            self._held = False
            self._condition.notify_all()


_queues: dict[str, WriterQueue] = {}
_queues_lock = threading.Lock()


def writer_queue(name: str) -> WriterQueue:
    with _queues_lock:
        return _queues.setdefault(name, WriterQueue())


# Idle connections kept per database file for the next request of this process.
IDLE_CONNECTIONS = 16
_idle: dict[tuple[int, str], list[Any]] = {}
_idle_lock = threading.Lock()


def _take_idle(key: tuple[int, str]) -> Any:
    with _idle_lock:
        idle = _idle.get(key)
        return idle.pop() if idle else None


def _give_idle(key: tuple[int, str], connection: Any) -> bool:
    with _idle_lock:
        idle = _idle.setdefault(key, [])
        if len(idle) >= IDLE_CONNECTIONS:
            return False
        idle.append(connection)
        return True


class DatabaseWrapper(base.DatabaseWrapper):
    """SQLite with writers queued in order (above), and connections reused across requests.

    Under ASGI Django runs each request on a thread of its own and closes the
    thread's connection at the end of it; opening one (Django registers its SQL
    functions and runs the PRAGMAs) was about a twentieth of a gateway call. A
    connection closed outside any transaction goes back to an idle list
    instead, and the next request's thread takes it: a file database is safe to
    use from another thread (Django opens it with ``check_same_thread=False``),
    one at a time. Keyed by the process id too, so a forked child never uses
    its parent's connections.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._holds_writer_turn = False

    def _queue(self) -> WriterQueue | None:
        # An in-memory database belongs to one connection: nobody to queue behind.
        if getattr(self, "transaction_mode", None) not in ("IMMEDIATE", "EXCLUSIVE") or self.is_in_memory_db():
            return None
        return writer_queue(str(self.settings_dict["NAME"]))

    def _start_transaction_under_autocommit(self) -> None:
        queue = self._queue()
        if queue is not None and not self._holds_writer_turn:
            self._holds_writer_turn = queue.acquire(QUEUE_TIMEOUT_SECONDS)
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]  # private hooks the stubs leave out
        except BaseException:
            self._end_writer_turn()
            raise

    def _end_writer_turn(self) -> None:
        if self._holds_writer_turn:
            self._holds_writer_turn = False
            queue = self._queue()
            if queue is not None:
                queue.release()

    def _commit(self) -> None:
        try:
            super()._commit()  # type: ignore[misc]  # private hooks the stubs leave out
        finally:
            self._end_writer_turn()

    def _rollback(self) -> None:
        try:
            super()._rollback()  # type: ignore[misc]  # private hooks the stubs leave out
        finally:
            self._end_writer_turn()

    def _idle_key(self) -> tuple[int, str] | None:
        return None if self.is_in_memory_db() else (os.getpid(), str(self.settings_dict["NAME"]))

    def get_new_connection(self, conn_params: Any) -> Any:
        key = self._idle_key()
        reused = _take_idle(key) if key is not None else None
        if reused is not None:
            # What a new connection starts with, whatever the last user changed (loaddata turns this off).
            reused.execute("PRAGMA foreign_keys = ON")
            return reused
        return super().get_new_connection(conn_params)

    def _close(self) -> None:
        try:
            key = self._idle_key()
            raw = self.connection
            if key is not None and raw is not None and not raw.in_transaction and not self.in_atomic_block \
                    and _give_idle(key, raw):
                return
            super()._close()  # type: ignore[misc]  # private hooks the stubs leave out
        finally:
            self._end_writer_turn()
