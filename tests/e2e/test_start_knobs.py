"""Every knob of the start command's README table, through the real start script in a fresh clone.

``PORT`` and ``CONTEXTLAB_OPEN_BROWSER`` are covered by every start here and in
``test_fresh_clone_start``, ``DATABASE_URL``/``REDIS_URL`` by its scaled test.
This one starts a clone of its own (so ``PYTHON`` and ``CONTEXTLAB_EXTRAS``
shape a new ``.venv``) with the rest set to non-default values: a data folder
outside the clone (``CONTEXTLAB_VAR_DIR``, given with ``~`` as a newcomer might
type it), a corpus folder of its own (``CONTEXTLAB_CORPUS_DIR``), an explicit
interpreter and extras. The start used to install the tokenizer files into
``./var`` and then look for them in ``$CONTEXTLAB_VAR_DIR``, never serving.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from contextlab.dashboard.management.commands.loaddemo import TAU_BENCH
from tests.e2e.test_fresh_clone_start import (
    FIRST_START_SECONDS,
    Started,
    clone,  # noqa: F401 (a fixture)
    newcomer_env,
    processes,  # noqa: F401 (a fixture)
    say,  # noqa: F401 (a fixture)
)
from tests.scaled.deployment import free_port

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.browser]


def test_it_starts_with_every_documented_knob_set_from_a_fresh_clone(clone, say, processes, tmp_path):  # noqa: F811
    home = tmp_path / "home"
    home.mkdir()
    data = home / "cl-data"
    corpus = tmp_path / "my-corpus"
    corpus.mkdir()
    # A transcript of our own under the name the demo looks for.
    (corpus / TAU_BENCH).parent.mkdir(parents=True)
    shutil.copyfile(REPO / "contextlab" / "sessions" / "demo_conversation.json", corpus / TAU_BENCH)
    python = Path(sys._base_executable).resolve()  # the interpreter under the test run's virtualenv
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    knobs = {"PORT": str(port), "CONTEXTLAB_OPEN_BROWSER": "0", "PYTHON": str(python),
             "CONTEXTLAB_EXTRAS": "dev,scaled", "CONTEXTLAB_CORPUS_DIR": str(corpus),
             "CONTEXTLAB_VAR_DIR": "~/cl-data", "HOME": str(home),
             # pip's cache stays the real one (it lives under the real home), so the
             # new virtualenv installs from it as any first start does.
             "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")}
    say(f"start.sh with {', '.join(f'{k}={v}' for k, v in knobs.items())}")
    start = Started("start-knobs", ["bash", "scripts/start.sh"], clone, newcomer_env(clone, **knobs))
    processes.append(start)
    start.wait_until_it_answers(base, FIRST_START_SECONDS, say)
    output = start.output()

    # CONTEXTLAB_VAR_DIR: the database, the tokenizer files and the workspaces are there, nothing in ./var.
    assert not (clone / "var").exists(), sorted(p.name for p in (clone / "var").iterdir())
    assert len(list((data / "tiktoken").iterdir())) == 2
    assert (data / "tiktoken").as_posix() in output
    with sqlite3.connect(next(data.glob("*.sqlite3"))) as db:
        titles = [row[0] for row in db.execute("SELECT title FROM contextlab_sessions_agentsession")]
    # CONTEXTLAB_CORPUS_DIR: the demo came from the corpus folder given; beside it, the shipped
    # conversation under both policies (the landing page's story of a loss).
    assert sorted(titles) == sorted([f"Demo: {TAU_BENCH.name}", "Demo story, copaw policy: demo_conversation.json",
                                     "Demo story, contextlab policy: demo_conversation.json"])
    assert "No corpus transcript" not in output
    assert any(data.rglob("*.jsonl")), "no session workspace under the data folder"
    # PYTHON and CONTEXTLAB_EXTRAS shaped the clone's new virtualenv.
    config = (clone / ".venv" / "pyvenv.cfg").read_text()
    assert f"home = {python.parent}" in config, config
    assert (clone / ".venv" / "bin" / "pytest").exists() and (clone / ".venv" / "bin" / "honcho").exists()
    # PORT: it serves there, on 127.0.0.1 only.
    assert f"ContextLab on {base}/" in output
