#!/usr/bin/env bash
# Installs everything the test suite needs, then runs it: lint, types, the
# whole suite on SQLite (embedded mode), and the web suite again on the local
# PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh

# Browser tests drive Debian's Chromium; Playwright never downloads a browser.
if ! command -v chromium >/dev/null; then
  echo "== installing Debian's chromium"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
bash scripts/services.sh

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy contextlab

echo "== pytest (embedded: SQLite)"
.venv/bin/python -m pytest -q "$@"

echo "== pytest (PostgreSQL)"
DATABASE_URL="${CONTEXTLAB_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/contextlab}" \
  .venv/bin/python -m pytest -q tests/sessions tests/api "$@"
