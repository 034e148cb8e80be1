"""Several threads writing at once need the database a deployment has: on SQLite a file
(WAL, busy timeout, IMMEDIATE transactions), not the shared in-memory database, whose
table locks fail at once instead of waiting. Collecting this folder switches the SQLite
test database to a temporary file for the whole run, as the browser tests do."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from django.conf import settings

_database = settings.DATABASES["default"]
if _database["ENGINE"].endswith("sqlite3") and not _database.get("TEST", {}).get("NAME"):
    _folder = tempfile.mkdtemp(prefix="contextlab-concurrency-db-")
    atexit.register(shutil.rmtree, _folder, ignore_errors=True)
    _database.setdefault("TEST", {})["NAME"] = os.path.join(_folder, "test.sqlite3")
