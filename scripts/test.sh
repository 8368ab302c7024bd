#!/usr/bin/env bash
# The README's test command: install flakekit and every plugin in plugins/ into .venv,
# make sure the services are up (PostgreSQL, MariaDB; ZooKeeper and etcd are started here and
# stopped on exit), and run the whole test suite. Extra arguments go to pytest.
#
# Several interpreters: PYTHONS="3.11 3.12 3.13" bash scripts/test.sh
#   Each gets its own venv (.venv for 3.11, the README's default; .venv-3.12, ...), found
#   on PATH or in pyenv. The services are set up once; the first interpreter runs the
#   whole suite, the others everything but the `slow` drills (real processes and
#   timeouts, the bulk of the time): PYTHONS_MARK="" runs the whole suite on each.
#   Every interpreter runs even if one fails; the exit status is non-zero if any did.
#
# Parallel: tests that are not `slow` run in 3 processes (TEST_WORKERS; see below).
set -Eeuo pipefail
trap 'echo "test.sh: line $LINENO: \`$BASH_COMMAND\` failed (exit $?)" >&2' ERR   # name a failed step
cd "$(dirname "$0")/.."

# -- interpreters and their venvs --------------------------------------------------------
find_python() {  # a version such as 3.12 (or a path) -> an interpreter that runs
  local want=$1 candidate candidates=()
  if [[ $want == */* ]]; then
    candidates=("$want")
  else
    candidates=("python$want")   # on PATH (a pyenv shim only runs when that version is active)
    while IFS= read -r candidate; do candidates+=("$candidate"); done < <(
      ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$want".*/bin/"python$want" 2>/dev/null | sort -rV)
  fi
  for candidate in "${candidates[@]}"; do
    if "$candidate" -c 'pass' >/dev/null 2>&1; then echo "$candidate"; return 0; fi
  done
  echo "test.sh: no Python $want found (python$want on PATH, or in pyenv); install it or drop it from PYTHONS" >&2
  return 1
}

version_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }

venv_for() {  # the README's .venv is 3.11's; other versions get their own
  if [ "$1" = 3.11 ]; then echo .venv; else echo ".venv-$1"; fi
}

install_into() {  # venv interpreter
  local venv=$1 python=$2
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  local pkgs=(-e '.[test]')
  for plugin in plugins/*/; do
    [ -f "$plugin/pyproject.toml" ] && pkgs+=(-e "${plugin%/}[test]")
  done
  local started=$SECONDS
  bash scripts/pip-install.sh "$venv" "${pkgs[@]}"
  echo "test.sh: $venv ready (Python $(version_of "$venv/bin/python"), $((SECONDS - started)) s)" >&2
}

venvs=()
if [ -z "${PYTHONS:-}" ]; then
  install_into .venv "${PYTHON:-python3}"     # the README's single-interpreter run
  venvs=(.venv)
else
  for want in $PYTHONS; do
    python=$(find_python "$want")
    version=$(version_of "$python")
    venv=$(venv_for "$version")
    if [ -x "$venv/bin/python" ] && [ "$(version_of "$venv/bin/python")" != "$version" ]; then
      echo "test.sh: $venv holds Python $(version_of "$venv/bin/python"), not $version; remove it and run again" >&2
      exit 2
    fi
    install_into "$venv" "$python"
    venvs+=("$venv")
  done
fi

# -- services, once ----------------------------------------------------------------------
bash scripts/services.sh
for setup in scripts/install-*.sh plugins/*/scripts/install-*.sh; do
  # e.g. Debian's chromium for the monitor-page test, systemd-analyze for tests/test_deploy.py
  [ -f "$setup" ] && bash "$setup"
done
if [ -f scripts/zookeeper.sh ]; then
  trap 'bash scripts/zookeeper.sh stop >/dev/null 2>&1 || true' EXIT
  bash scripts/zookeeper.sh start
  # shellcheck disable=SC1091
  . "${FLAKEKIT_SVC_DIR:-/tmp/flakekit-svc}/env"
  export ZK_HOSTS ZK_ENSEMBLE_HOSTS
fi
if [ -f scripts/etcd.sh ]; then   # after ZooKeeper: its start rewrites the env file
  trap 'bash scripts/etcd.sh stop >/dev/null 2>&1 || true; bash scripts/zookeeper.sh stop >/dev/null 2>&1 || true' EXIT
  bash scripts/etcd.sh start
  # shellcheck disable=SC1091
  . "${FLAKEKIT_SVC_DIR:-/tmp/flakekit-svc}/env"
  export ETCD_ENDPOINTS ETCD_CLUSTER_ENDPOINTS
fi

# -- the suite, per interpreter ----------------------------------------------------------
# The tests that are not `slow` run in TEST_WORKERS processes (pytest-xdist, default 3: they
# mostly wait on sockets, databases and leases); then the `slow` drills marked
# `slow_parallel` (no timing margin at stake: wheel builds, processes racing for ids) two
# at a time, and the other `slow` drills (real processes, kill -9, SIGSTOP past a lease,
# timeouts) alone, one at a time, as ever. Each run prints its 15 slowest tests.
# TEST_WORKERS=0, or an -m or -n among the arguments, makes it one plain pytest run.
workers=${TEST_WORKERS:-3}
for arg in "$@"; do
  case $arg in -m | -m* | -n | -n* | --numprocesses*) workers=0 ;; esac
done

rc=0
summary=()
pytest_run() {  # venv label [pytest args...]: one run; a failure's status into $rc (5 counts as 0)
  local venv=$1 label=$2 one=0
  shift 2
  if [ "${#venvs[@]}" -gt 1 ] || [ "$workers" != 0 ]; then echo "== $label" >&2; fi
  "$venv/bin/python" -m pytest -p no:cacheprovider --durations=15 --durations-min=1 "$@" || one=$?   # and the 15 slowest
  [ "$one" = 5 ] && one=0   # no tests collected (e.g. a -k that matches nothing)
  summary+=("$label: $([ "$one" = 0 ] && echo passed || echo "FAILED (exit $one)")")
  [ "$one" = 0 ] || rc=$one
}

for i in "${!venvs[@]}"; do
  venv=${venvs[$i]}
  version=$(version_of "$venv/bin/python")
  mark=""   # the first interpreter runs everything; the others "${PYTHONS_MARK-not slow}"
  if [ "$i" -gt 0 ]; then mark=${PYTHONS_MARK-not slow}; fi
  if [ "$workers" != 0 ] && { [ -z "$mark" ] || [ "$mark" = "not slow" ]; }; then
    pytest_run "$venv" "Python $version ($venv, not slow, $workers processes)" \
      -m "not slow" -n "$workers" "$@"
    if [ -z "$mark" ]; then
      # the slow drills that hold no timing margin (conftest.py SLOW_PARALLEL) two at a
      # time, a module per process; then every other one alone
      pytest_run "$venv" "Python $version ($venv, slow, 2 processes: slow_parallel)" \
        -m "slow and slow_parallel" -n 2 --dist loadfile "$@"
      pytest_run "$venv" "Python $version ($venv, slow, one at a time)" \
        -m "slow and not slow_parallel" "$@"
    fi
  elif [ -n "$mark" ]; then
    pytest_run "$venv" "Python $version ($venv, -m \"$mark\")" -m "$mark" "$@"
  else
    pytest_run "$venv" "Python $version ($venv)" "$@"
  fi
done
if [ "${#summary[@]}" -gt 1 ]; then
  printf '%s\n' "${summary[@]}" >&2
fi
exit "$rc"
