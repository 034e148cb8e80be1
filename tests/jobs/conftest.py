"""Jobs in embedded mode: eager Celery tasks on the thread pool of this process.

These tests set the embedded mode themselves, so they mean the same thing when
the suite runs with REDIS_URL set (the channel layer is then Redis, for real).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import get_channel_layer

from contextlab.celery import app
from contextlab.support import jobs, live


@pytest.fixture(autouse=True)
def embedded_jobs(settings: Any) -> Iterator[None]:
    settings.CONTEXTLAB_JOBS_MODE = "embedded"
    eager = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    assert jobs.drain(30), "a background job was still running at the end of the test"
    live.flush()
    app.conf.task_always_eager = eager


class Viewer:
    """A channel in a session's group, like a page's websocket, reading the events sent to it.

    It keeps one event loop of its own: the Redis layer binds a channel's
    receive buffer to the loop that first reads it.
    """

    def __init__(self, group: str) -> None:
        self.group = group
        self.layer = get_channel_layer()
        self.loop = asyncio.new_event_loop()
        self.channel = self.loop.run_until_complete(self.layer.new_channel())
        self.loop.run_until_complete(self.layer.group_add(group, self.channel))

    def events(self, *, wait: float = 0.3) -> list[dict[str, Any]]:
        """Every event waiting for this viewer (after the coalescing interval has passed)."""
        live.flush()

        async def read() -> list[dict[str, Any]]:
            got: list[dict[str, Any]] = []
            while True:
                try:
                    got.append(await asyncio.wait_for(self.layer.receive(self.channel), wait))
                except TimeoutError:
                    return got

        return self.loop.run_until_complete(read())

    def close(self) -> None:
        self.loop.run_until_complete(self.layer.group_discard(self.group, self.channel))
        self.loop.close()


@pytest.fixture
def viewer() -> Iterator[Any]:
    opened: list[Viewer] = []

    def open_viewer(session_id: object) -> Viewer:
        v = Viewer(live.session_group(session_id))
        opened.append(v)
        return v

    yield open_viewer
    for v in opened:
        v.close()
