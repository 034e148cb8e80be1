"""Issue 12, item 6: no well-known secret key in any mode.

Settings are loaded in a child process, each with an environment of its own,
as a real start would load them.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRINT_KEY = "from django.conf import settings; print(settings.SECRET_KEY)"
# The key main shipped to every install.
OLD_DEFAULT = "contextlab-development-key-change-me-in-production"


def _settings(var_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("SECRET_KEY", "SECRET_KEY_FILE", "DATABASE_URL", "REDIS_URL") and not k.startswith("PYTEST")}
    clean.update({"DJANGO_SETTINGS_MODULE": "contextlab.settings", "CONTEXTLAB_VAR_DIR": str(var_dir), **env})
    return subprocess.run([sys.executable, "-c", f"import django; django.setup(); {PRINT_KEY}"], cwd=REPO,
                          env=clean, capture_output=True, text=True, timeout=120)


def test_embedded_mode_makes_one_key_per_install_readable_by_its_owner_only(tmp_path):
    first = _settings(tmp_path / "one")
    assert first.returncode == 0, first.stderr
    key = first.stdout.strip()
    assert len(key) >= 50 and key != OLD_DEFAULT
    stored = tmp_path / "one" / "secret_key"
    assert stored.read_text().strip() == key
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    again = _settings(tmp_path / "one")
    assert again.stdout.strip() == key  # kept: sessions survive a restart
    other = _settings(tmp_path / "two")
    assert other.stdout.strip() not in (key, "")  # another install, another key


def test_scaled_mode_refuses_to_start_without_a_key(tmp_path):
    for env in ({"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/x"}, {"REDIS_URL": "redis://127.0.0.1:6379/9"}):
        refused = _settings(tmp_path, **env)
        assert refused.returncode != 0
        assert "SECRET_KEY is not set" in refused.stderr
        assert not (tmp_path / "secret_key").exists()


def test_scaled_mode_uses_the_operators_key(tmp_path):
    done = _settings(tmp_path, DATABASE_URL="postgres://postgres@127.0.0.1:5432/x", SECRET_KEY="k" * 60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "k" * 60
