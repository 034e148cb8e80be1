#!/usr/bin/env bash
# Makes sure the local PostgreSQL and Redis the scaled-mode tests use are up,
# starting Debian's packaged servers when they are installed but stopped.
set -euo pipefail

if command -v pg_isready >/dev/null && ! pg_isready -q -h 127.0.0.1 -p 5432; then
  echo "== starting PostgreSQL"
  version="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)"
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
fi
if command -v redis-cli >/dev/null && ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "== starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
fi
pg_isready -q -h 127.0.0.1 -p 5432 || { echo "PostgreSQL is not reachable on 127.0.0.1:5432" >&2; exit 1; }
redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null || { echo "Redis is not reachable on 127.0.0.1:6379" >&2; exit 1; }
