#!/usr/bin/env bash
# axe-core, the accessibility engine the browser tests inject into every page
# (tests/e2e/test_page_walk.py), from npm into var/npm. Skipped when the pinned
# version is already there; only the test command needs it, not the server.
set -euo pipefail
cd "$(dirname "$0")/.."
version=4.14.1
target=var/npm
installed="$target/node_modules/axe-core/package.json"
if [ -f "$installed" ] && grep -q "\"version\": \"$version\"" "$installed"; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "npm is needed for the browser tests' accessibility checks (Debian: apt-get install npm)" >&2
  exit 1
fi
echo "== axe-core $version from npm into $target"
mkdir -p "$target"
npm install --silent --no-audit --no-fund --prefix "$target" "axe-core@$version" >/dev/null
