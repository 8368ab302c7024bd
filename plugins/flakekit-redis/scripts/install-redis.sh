#!/usr/bin/env bash
# Install Debian's redis-server for the Redis plugin's tests (idempotent). Nothing is
# started here: the tests use $REDIS_URL or 127.0.0.1:6379 when it answers, else a
# redis-server of their own on a free port (and throw-away ones for the restart drill).
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install-redis.sh: redis-server is missing; run as root (apt-get install -y redis-server)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends redis-server >/dev/null
