"""Browser tests: channels' live server (Daphne in a subprocess) driven by Debian's Chromium.

The server process reads the database the test writes, so the test database
must be a file: collecting this folder switches the SQLite test database from
memory to a temporary file, for the whole run (it is created once per run).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from django.conf import settings

# Playwright's sync API runs an event loop in the test thread; the ORM calls of
# the tests around it are still synchronous and safe.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

_database = settings.DATABASES["default"]
if _database["ENGINE"].endswith("sqlite3"):
    _folder = tempfile.mkdtemp(prefix="contextlab-e2e-db-")
    atexit.register(shutil.rmtree, _folder, ignore_errors=True)
    _database.setdefault("TEST", {})["NAME"] = os.path.join(_folder, "test.sqlite3")
else:
    # The server process names the test database from TEST.NAME, or else from
    # NAME, which by then already is the test database's name ("test_test_…").
    _test = _database.setdefault("TEST", {})
    if not _test.get("NAME"):
        _test["NAME"] = f"test_{_database['NAME']}"
