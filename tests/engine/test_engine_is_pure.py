from __future__ import annotations

import subprocess
import sys

import pytest

from tests.corpus import REPO


@pytest.mark.parametrize(
    "modules",
    [
        pytest.param(
            ("contextlab.engine", "contextlab.engine.replay.transcript", "contextlab.engine.policies.copaw.reference", "contextlab.engine.importers",
             "contextlab.engine.memory.reinject", "contextlab.engine.replay.whatif"),
            id="engine",
        ),
        pytest.param(
            (
                "contextlab.engine.policies.eviction",
                "contextlab.engine.replay.compare",
                "contextlab.engine.memory.retrieval",
                "contextlab.engine.memory.working",
                "contextlab.engine.memory.long_term",
            ),
            id="eviction-retrieval-memory",
        ),
    ],
)
def test_it_imports_the_engine_without_django(modules: tuple[str, ...]) -> None:
    # A fresh interpreter: this test process has Django loaded already.
    code = (
        f"import sys, {', '.join(modules)};"
        "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
