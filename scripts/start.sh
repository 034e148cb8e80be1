#!/usr/bin/env bash
# Runs ContextLab the embedded way: SQLite, no Redis, one process, with a demo
# session loaded, and opens the browser.
set -euo pipefail
cd "$(dirname "$0")/.."
CONTEXTLAB_EXTRAS="${CONTEXTLAB_EXTRAS:-scaled}" bash scripts/bootstrap.sh

PORT="${PORT:-8000}"
.venv/bin/python manage.py migrate --noinput
.venv/bin/python manage.py loaddemo
URL="http://127.0.0.1:${PORT}/"
echo "== ContextLab on ${URL} (log in as demo / demo)"
( sleep 2; command -v xdg-open >/dev/null && xdg-open "$URL" >/dev/null 2>&1 || true ) &
exec .venv/bin/daphne -b 127.0.0.1 -p "$PORT" contextlab.asgi:application
