#!/usr/bin/env bash
# Install Debian's systemd for `systemd-analyze verify` of deploy/systemd/flakekit.service
# (tests/test_deploy.py; idempotent). Only the analyzer is used: nothing is started.
exec bash "$(dirname "$0")/apt-install.sh" systemd-analyze systemd --no-install-recommends
