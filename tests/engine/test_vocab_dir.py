"""Issue 27 item 8: the install script, the engine and the settings look for the tokenizer files in one place.

The order: CONTEXTLAB_TIKTOKEN_DIR, else CONTEXTLAB_VAR_DIR/tiktoken, else
var/tiktoken in the repository. The install step used to ignore
CONTEXTLAB_VAR_DIR, so a start with it set never found the files it had just
installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from contextlab.engine.core.tokens import default_vocab_dir
from tests.engine.test_tokens import load_install_script

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("env", "expected"), [
    ({"CONTEXTLAB_TIKTOKEN_DIR": "/srv/tok", "CONTEXTLAB_VAR_DIR": "/srv/data"}, Path("/srv/tok")),
    ({"CONTEXTLAB_VAR_DIR": "/srv/data"}, Path("/srv/data/tiktoken")),
    ({"CONTEXTLAB_VAR_DIR": "~/cl-data", "HOME": "/home/someone"}, Path("/home/someone/cl-data/tiktoken")),
    ({}, REPO / "var" / "tiktoken"),
])
def test_it_installs_where_the_engine_and_the_settings_look(monkeypatch, tmp_path, env, expected):
    for name in ("CONTEXTLAB_TIKTOKEN_DIR", "CONTEXTLAB_VAR_DIR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert load_install_script().default_dest() == expected
    assert default_vocab_dir() == expected
    # The settings, loaded as a start loads them (a child process), with the
    # data folder under this test's own folder so no test creates var/ folders.
    child = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "CONTEXTLAB_"))}
    child.update({"DJANGO_SETTINGS_MODULE": "contextlab.settings", "SECRET_KEY": "k" * 60, "HOME": str(tmp_path),
                  "CONTEXTLAB_VAR_DIR": env.get("CONTEXTLAB_VAR_DIR", "~/default-data").replace("/srv", str(tmp_path))})
    if "CONTEXTLAB_TIKTOKEN_DIR" in env:
        child["CONTEXTLAB_TIKTOKEN_DIR"] = env["CONTEXTLAB_TIKTOKEN_DIR"]
    done = subprocess.run([sys.executable, "-c", "from contextlab import settings; print(settings.TIKTOKEN_DIR)"],
                          cwd=REPO, env=child, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    child_var = Path(child["CONTEXTLAB_VAR_DIR"].replace("~", str(tmp_path), 1))
    wanted = Path(env["CONTEXTLAB_TIKTOKEN_DIR"]) if "CONTEXTLAB_TIKTOKEN_DIR" in env else child_var / "tiktoken"
    assert Path(done.stdout.strip()) == wanted
