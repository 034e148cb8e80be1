"""With CONTEXTLAB_SCALED_TESTS=1 the scaled tests must fail, not skip, when Redis or PostgreSQL is missing."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conversations import REPO


def test_the_scaled_tests_fail_when_redis_is_unreachable(tmp_path):
    env = {**os.environ, "CONTEXTLAB_SCALED_TESTS": "1",
           # Nothing listens on port 1 of the loopback address.
           "CONTEXTLAB_TEST_REDIS_URL": "redis://127.0.0.1:1/0"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--basetemp", str(tmp_path / "run"),
         "tests/scaled/test_scaled_mode.py", "-k", "delivers"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Redis is not reachable at redis://127.0.0.1:1/0" in done.stdout
    assert "1 error" in done.stdout or "1 failed" in done.stdout


def test_the_scaled_tests_say_why_they_are_skipped_without_the_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CONTEXTLAB_SCALED_TESTS"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "--basetemp", str(tmp_path / "run"),
         "tests/scaled/test_scaled_mode.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "set CONTEXTLAB_SCALED_TESTS=1" in done.stdout
