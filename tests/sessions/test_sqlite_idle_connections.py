"""A file database's connection closed at the end of a request is reused by the next request's thread."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from contextlab.db.sqlite3.base import DatabaseWrapper

pytestmark = pytest.mark.django_db


@pytest.fixture
def wrapper_for(tmp_path: Path):
    if connections["default"].vendor != "sqlite":
        pytest.skip("the SQLite backend only")
    made: list[DatabaseWrapper] = []

    def make() -> DatabaseWrapper:
        settings = {**connections["default"].settings_dict, "NAME": str(tmp_path / "idle.sqlite3")}
        wrapper = DatabaseWrapper(settings, alias=f"idle-{len(made)}")
        made.append(wrapper)
        return wrapper

    yield make
    for wrapper in made:
        wrapper.inc_thread_sharing()
        if wrapper.connection is not None:
            wrapper.connection.close()


def _in_thread(work: Any) -> Any:
    # Each request runs on a thread of its own under ASGI.
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def test_it_reuses_a_closed_connection_on_the_next_requests_thread(wrapper_for):
    def request() -> int:
        wrapper = wrapper_for()
        with wrapper.cursor() as cursor:
            cursor.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
            cursor.execute("INSERT INTO t VALUES (1)")
        raw = id(wrapper.connection)
        wrapper.close()
        return raw

    first = _in_thread(request)
    assert _in_thread(request) == first


def test_it_never_reuses_a_connection_closed_inside_a_transaction(wrapper_for):
    def request(leave_open: bool) -> int:
        wrapper = wrapper_for()
        wrapper.ensure_connection()
        raw = wrapper.connection
        if leave_open:
            raw.execute("BEGIN")
            raw.execute("CREATE TABLE IF NOT EXISTS u (x INTEGER)")
        wrapper.close()
        return id(raw)

    opened_in_transaction = _in_thread(lambda: request(True))
    clean = _in_thread(lambda: request(False))
    assert clean != opened_in_transaction
    # The one closed cleanly is the one reused.
    assert _in_thread(lambda: request(False)) == clean
