#!/usr/bin/env bash
# Runs ContextLab the embedded way: SQLite, no Redis, one process, with a demo
# session loaded, and opens the browser.
#
# Knobs (environment): PORT (default 8000), CONTEXTLAB_OPEN_BROWSER=0 to not open
# a browser, PYTHON and CONTEXTLAB_EXTRAS (see bootstrap.sh), and every setting
# of contextlab/settings.py. With DATABASE_URL set (a shared database) no demo
# login is created: see the README for how to create users.
set -euo pipefail
cd "$(dirname "$0")/.."
CONTEXTLAB_EXTRAS="${CONTEXTLAB_EXTRAS:-scaled}" bash scripts/bootstrap.sh

PORT="${PORT:-8000}"
# This script serves plain HTTP on 127.0.0.1 itself: no HTTPS redirect or
# secure-only cookies, even on a shared database (see docs/scaled-mode.md).
export CONTEXTLAB_HTTPS="${CONTEXTLAB_HTTPS:-0}"
.venv/bin/python manage.py migrate --noinput
URL="http://127.0.0.1:${PORT}/"
if [ -z "${DATABASE_URL:-}" ]; then
  .venv/bin/python manage.py loaddemo
  echo "== ContextLab on ${URL} (log in as demo / demo)"
else
  echo "== ContextLab on ${URL}"
  echo "   DATABASE_URL is set: no demo login on a shared database. Create an account with"
  echo "   .venv/bin/python manage.py createsuperuser   (then: manage.py loaddemo --owner USERNAME)"
fi
if [ "${CONTEXTLAB_OPEN_BROWSER:-1}" != "0" ]; then
  ( sleep 2; command -v xdg-open >/dev/null && xdg-open "$URL" >/dev/null 2>&1 || true ) &
fi
# uvicorn with uvloop and httptools: of the ASGI servers measured (daphne, uvicorn,
# granian, hypercorn; benchmarks/gateway_vs_litellm.py --server), the one that
# spends the least per request; Channels' websockets run on it as on daphne.
exec .venv/bin/uvicorn --host 127.0.0.1 --port "$PORT" --loop uvloop --http contextlab.core.uvicorn_http:HeaderTimeoutHttpTools --ws websockets \
  --lifespan off --no-access-log contextlab.asgi:application
