#!/usr/bin/env bash
# The README's test command: install flakekit and every plugin in plugins/ into .venv,
# make sure the services are up (PostgreSQL, MariaDB; ZooKeeper is started here and
# stopped on exit), and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pkgs=(-e '.[test]')
for plugin in plugins/*/; do
  [ -f "$plugin/pyproject.toml" ] && pkgs+=(-e "${plugin%/}[test]")
done
.venv/bin/python -m pip install -q --disable-pip-version-check "${pkgs[@]}"

bash scripts/services.sh
for setup in plugins/*/scripts/install-*.sh; do
  [ -f "$setup" ] && bash "$setup"     # e.g. Debian's chromium for the monitor-page test
done
if [ -f scripts/zookeeper.sh ]; then
  trap 'bash scripts/zookeeper.sh stop >/dev/null 2>&1 || true' EXIT
  bash scripts/zookeeper.sh start
  # shellcheck disable=SC1091
  . "${FLAKEKIT_SVC_DIR:-/tmp/flakekit-svc}/env"
  export ZK_HOSTS ZK_ENSEMBLE_HOSTS
fi

rc=0
.venv/bin/python -m pytest -p no:cacheprovider "$@" || rc=$?
[ "$rc" = 5 ] && rc=0   # no tests collected (e.g. a -k that matches nothing)
exit "$rc"
