#!/usr/bin/env bash
# Install Debian's systemd for `systemd-analyze verify` of deploy/systemd/flakekit.service
# (tests/test_deploy.py; idempotent). Only the analyzer is used: nothing is started.
set -euo pipefail
if command -v systemd-analyze >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install-systemd.sh: systemd-analyze is missing; run as root (apt-get install -y systemd)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends systemd >/dev/null
