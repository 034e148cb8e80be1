#!/usr/bin/env bash
# Screenshots of every dashboard page, from a real corpus session, into
# docs/screenshots/. Needs Debian's chromium (scripts/test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
CONTEXTLAB_SCREENSHOTS=1 exec .venv/bin/python -m pytest -q tests/e2e/test_screenshots.py "$@"
