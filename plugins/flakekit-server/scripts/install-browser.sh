#!/usr/bin/env bash
# Install Debian's chromium for the monitor-page browser test (idempotent).
exec bash "$(dirname "$0")/../../../scripts/apt-install.sh" /usr/bin/chromium chromium
