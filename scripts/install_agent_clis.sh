#!/usr/bin/env bash
# Installs the real agent CLIs the gateway tests drive headless, pinned, from
# npm, into var/npm/ (project-local: nothing global is touched; the packages
# ship their prebuilt binaries). Each CLI is one line of AGENT_CLIS:
# "npm-package@version". Re-running is cheap: a package already at its pinned
# version is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

AGENT_CLIS=(
  "@anthropic-ai/claude-code@2.1.332"   # Claude Code: tests/gateway/agents/test_claude_code.py
  "@openai/codex@0.171.0"               # Codex CLI: tests/gateway/test_codex_cli.py
)

if ! command -v npm >/dev/null; then
  echo "== installing Debian's nodejs and npm"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi

PREFIX="${CONTEXTLAB_NPM_PREFIX:-var/npm}"
mkdir -p "$PREFIX"
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
