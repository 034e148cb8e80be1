#!/usr/bin/env bash
# Shared set-up for scripts/start.sh and scripts/test.sh: a virtualenv in .venv
# with ContextLab installed, and the tokenizer vocabularies in var/tiktoken.
# Safe to run again: each step skips what is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PYTHON" -m venv .venv
fi
# Re-install only when the declared dependencies changed since the last install.
stamp=.venv/.contextlab-installed
extras="${CONTEXTLAB_EXTRAS:-dev,scaled}"
wanted="$(sha256sum pyproject.toml | cut -c1-16)-$extras"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
  echo "== installing ContextLab and its dependencies ($extras)"
  # No "a new pip is available" notice: the next line installs the newest.
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$extras]"
  echo "$wanted" > "$stamp"
fi
echo "== tokenizer vocabularies"
.venv/bin/python scripts/install_tiktoken_data.py
