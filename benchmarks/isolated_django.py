"""Django for a benchmark that runs in its own process: a database and workspaces of its own.

A benchmark never touches the developer's ``var/``: it gets an SQLite database
(migrated here) and a workspaces folder inside ``folder``, which it removes when
it is done.
"""

from __future__ import annotations

import os
from pathlib import Path


def setup(folder: Path) -> None:
    os.environ["DATABASE_URL"] = f"sqlite:///{folder / 'bench.sqlite3'}"
    os.environ["CONTEXTLAB_WORKSPACES_DIR"] = str(folder / "workspaces")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "contextlab.settings")
    os.environ.setdefault("CONTEXTLAB_EMBEDDED_BEAT", "false")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
