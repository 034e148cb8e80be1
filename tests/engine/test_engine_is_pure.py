from __future__ import annotations

import subprocess
import sys

from tests.corpus import REPO


def test_it_imports_the_engine_without_django() -> None:
    code = (
        "import sys, contextlab.engine, contextlab.engine.replay, contextlab.engine.copaw, "
        "contextlab.engine.importers;"
        "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
