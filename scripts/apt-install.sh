#!/usr/bin/env bash
# Install a Debian package unless the command it brings is there (idempotent):
#   bash scripts/apt-install.sh COMMAND PACKAGE [apt-get options...]
# for the tests' tools (scripts/install-systemd.sh, plugins/flakekit-server/scripts/install-browser.sh).
set -euo pipefail
command=$1 package=$2
shift 2
if command -v "$command" >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "$(basename "$0"): $command is missing; run as root (apt-get install -y $package)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "$@" "$package" >/dev/null
