"""Scaled mode for real: PostgreSQL, Redis, a celery worker and two uvicorn web processes.

These tests run when ``CONTEXTLAB_SCALED_TESTS=1`` (scripts/test.sh sets it).
Then PostgreSQL and Redis must be reachable on 127.0.0.1 (or at
``CONTEXTLAB_TEST_POSTGRES_URL`` / ``CONTEXTLAB_TEST_REDIS_URL``): when they are
not, the tests fail; they never skip quietly.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.scaled.deployment import Api, Deployment, Unavailable

SCALED = os.environ.get("CONTEXTLAB_SCALED_TESTS") == "1"
skip_unless_scaled = pytest.mark.skipif(
    not SCALED, reason="scaled-mode tests: set CONTEXTLAB_SCALED_TESTS=1 (PostgreSQL and Redis on 127.0.0.1)")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """A migrated database and two web processes, for one test module."""
    folder: Path = tmp_path_factory.mktemp("scaled")
    deployment = Deployment(folder, env_extra={"CONTEXTLAB_REAP_SECONDS": "1"})
    try:
        deployment.create()
    except Unavailable as exc:
        pytest.fail(f"CONTEXTLAB_SCALED_TESTS=1 but {exc}", pytrace=False)
    try:
        deployment.start_web("web1")
        deployment.start_web("web2")
        deployment.api_token()
        yield deployment
    finally:
        deployment.destroy()


@pytest.fixture
def web1(deployment: Deployment) -> Iterator[Api]:
    api = Api(deployment.processes["web1"].url, deployment.token)
    yield api
    api.close()


@pytest.fixture
def web2(deployment: Deployment) -> Iterator[Api]:
    api = Api(deployment.processes["web2"].url, deployment.token)
    yield api
    api.close()
