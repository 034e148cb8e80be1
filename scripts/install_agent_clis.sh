#!/usr/bin/env bash
# Installs the real agent CLIs the gateway tests drive (tests/gateway/agents/),
# pinned, from npm, into var/npm/ (project-local: nothing global is touched).
# Each CLI is one line of AGENT_CLIS: "npm-package@version". Re-running is
# cheap: a package already at its pinned version is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

AGENT_CLIS=(
  "@anthropic-ai/claude-code@2.1.332"   # Claude Code: tests/gateway/agents/test_claude_code.py
)

PREFIX="${CONTEXTLAB_NPM_PREFIX:-var/npm}"
mkdir -p "$PREFIX"
if ! command -v npm >/dev/null; then
  echo "npm is not installed: the agent CLI tests will be skipped (apt-get install nodejs npm)" >&2
  exit 0
fi

missing=()
for spec in "${AGENT_CLIS[@]}"; do
  name="${spec%@*}"
  version="${spec##*@}"
  installed="$(node -p "try{require('./$PREFIX/node_modules/$name/package.json').version}catch(e){''}" 2>/dev/null || true)"
  if [ "$installed" != "$version" ]; then
    missing+=("$spec")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== npm: installing ${missing[*]} into $PREFIX"
  npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error --save-exact "${missing[@]}"
fi
