#!/usr/bin/env bash
# The real agent CLIs the gateway tests run headless, pinned, from npm into
# var/npm (project-local; the packages ship their prebuilt binaries).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v npm >/dev/null; then
  echo "== installing Debian's nodejs and npm"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
mkdir -p var/npm
npm install --prefix var/npm --no-audit --no-fund --loglevel=error @openai/codex@0.171.0
