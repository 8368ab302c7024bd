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
# Parallel: tests that are not `slow` run in 3 processes (TEST_WORKERS), beside the slow
# drills at the lowest CPU priority (TEST_OVERLAP=0: one lane after another); see below.
# TEST_EXTRAS (default "test") are the extras of flakekit installed into the first venv;
# TEST_ALONGSIDE, a command run beside the drills too (.ci/run: the docs and linters).
set -Eeuo pipefail
trap 'echo "test.sh: line $LINENO: \`$BASH_COMMAND\` failed (exit $?)" >&2' ERR   # name a failed step
cd "$(dirname "$0")/.."
work=$(mktemp -d "${TMPDIR:-/tmp}/flakekit-test.XXXXXX")   # lane logs, statuses, junit files
cleanups=('rm -rf "$work"')   # run on exit, the last added first
on_exit() {
  local i
  for ((i = ${#cleanups[@]} - 1; i >= 0; i--)); do eval "${cleanups[$i]}" || true; done
}
trap on_exit EXIT

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

install_into() {  # venv interpreter [extras of flakekit]
  local venv=$1 python=$2 extras=${3:-test}
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv" || return   # (set -e is off
  # in install_later's `||`: each step says itself that it failed)
  local pkgs=(-e ".[$extras]")
  for plugin in plugins/*/; do
    [ -f "$plugin/pyproject.toml" ] && pkgs+=(-e "${plugin%/}[test]")
  done
  local started=$SECONDS
  bash scripts/pip-install.sh "$venv" "${pkgs[@]}" || return
  echo "test.sh: $venv ready (Python $(version_of "$venv/bin/python"), $((SECONDS - started)) s)" >&2
}

venvs=()
pythons=()
if [ -z "${PYTHONS:-}" ]; then
  venvs=(.venv)     # the README's single-interpreter run
  pythons=("${PYTHON:-python3}")
else
  for want in $PYTHONS; do
    python=$(find_python "$want")
    version=$(version_of "$python")
    venv=$(venv_for "$version")
    if [ -x "$venv/bin/python" ] && [ "$(version_of "$venv/bin/python")" != "$version" ]; then
      echo "test.sh: $venv holds Python $(version_of "$venv/bin/python"), not $version; remove it and run again" >&2
      exit 2
    fi
    venvs+=("$venv")
    pythons+=("$python")
  done
fi

# the other venvs install meanwhile, at the lowest CPU and I/O priority (each into a venv of its
# own: the editable installs write nothing into the source tree, hatchling); a lane that
# needs one waits for $work/installed-I, which holds pip's exit status
install_later() {  # index
  local one=0
  install_into "${venvs[$1]}" "${pythons[$1]}" >"$work/install-$1.log" 2>&1 || one=$?
  echo "$one" >"$work/installed-$1"
}
await_install() {  # index: its log printed; succeeds if the install did
  while [ ! -f "$work/installed-$1" ]; do sleep 1; done
  cat "$work/install-$1.log" >&2
  [ "$(cat "$work/installed-$1")" = 0 ]
}
lowest_priority() {  # this (sub)shell and what it starts: nice 19, the lowest best-effort I/O
  renice -n 19 -p "$BASHPID" >/dev/null
  ionice -c 2 -n 7 -p "$BASHPID" 2>/dev/null || true
}
later=()
for i in "${!venvs[@]}"; do
  if [ "$i" -gt 0 ]; then
    (lowest_priority; install_later "$i") &
    later+=($!)
  fi
done
cleanups+=('kill "${later[@]}" 2>/dev/null')

# -- services, once, while the first venv installs ----------------------------------------
services() {
  bash scripts/services.sh
  local setup
  for setup in scripts/install-*.sh plugins/*/scripts/install-*.sh; do
    # e.g. Debian's chromium for the monitor-page test, systemd-analyze for tests/test_deploy.py
    if [ -f "$setup" ]; then bash "$setup"; fi
  done
  if [ -f scripts/zookeeper.sh ]; then bash scripts/zookeeper.sh start; fi
  # after ZooKeeper: its start rewrites the env file
  if [ -f scripts/etcd.sh ]; then bash scripts/etcd.sh start; fi
}
[ -f scripts/zookeeper.sh ] && cleanups+=('bash scripts/zookeeper.sh stop >/dev/null 2>&1')
[ -f scripts/etcd.sh ] && cleanups+=('bash scripts/etcd.sh stop >/dev/null 2>&1')
services >"$work/services.log" 2>&1 &
svc=$!
install_into "${venvs[0]}" "${pythons[0]}" "${TEST_EXTRAS:-test}"
svc_rc=0
wait "$svc" || svc_rc=$?
cat "$work/services.log" >&2
if [ "$svc_rc" != 0 ]; then
  echo "test.sh: setting up the services failed (exit $svc_rc); see above" >&2
  exit "$svc_rc"
fi
if [ -f "${FLAKEKIT_SVC_DIR:-/tmp/flakekit-svc}/env" ]; then
  # shellcheck disable=SC1091
  . "${FLAKEKIT_SVC_DIR:-/tmp/flakekit-svc}/env"
  export ZK_HOSTS ZK_ENSEMBLE_HOSTS ETCD_ENDPOINTS ETCD_CLUSTER_ENDPOINTS
fi

# -- the suite, per interpreter ----------------------------------------------------------
# The tests that are not `slow` run in TEST_WORKERS processes (pytest-xdist, default 3: they
# mostly wait on sockets, databases and leases). The `slow` drills of the first interpreter
# marked `slow_parallel` (no timing margin at stake: wheel builds, processes racing for
# ids) run two at a time, then the other `slow` drills (real processes, kill -9, SIGSTOP
# past a lease, timeouts) alone, one at a time, as ever; the fail-over drills (conftest.py
# SLOW_BESIDE: servers of their own, no deadline at stake) beside them at nice 10. Beside those (TEST_OVERLAP=1,
# the default), at nice 19 and the lowest best-effort I/O priority so the drills keep the
# CPU whenever they want it, one after another: the first interpreter's `not slow` lane,
# each other interpreter's (once its venv is installed) and TEST_ALONGSIDE; their output
# follows the drills'. Each run prints its 15 slowest tests, the end the 15 slowest of all.
# TEST_WORKERS=0, or an -m or -n among the arguments, makes it one plain pytest run per
# interpreter, one after another.
workers=${TEST_WORKERS:-3}
for arg in "$@"; do
  case $arg in -m | -m* | -n | -n* | --numprocesses*) workers=0 ;; esac
done
overlap=${TEST_OVERLAP:-1}
[ "$workers" = 0 ] && overlap=0

lanes=0
lane() {  # label venv [pytest args...]: one run; "label, exit status, s, junit file" into
  # $work/status (5, no tests collected, e.g. a -k that matches nothing, counts as 0)
  local label=$1 venv=$2 one=0 started=$SECONDS xml
  shift 2
  lanes=$((lanes + 1))
  xml="$work/lane-$BASHPID-$lanes.xml"
  if [ "${#venvs[@]}" -gt 1 ] || [ "$workers" != 0 ]; then echo "== $label" >&2; fi
  "$venv/bin/python" -m pytest -p no:cacheprovider --durations=15 --durations-min=1 \
    --junitxml="$xml" "$@" || one=$?
  [ "$one" = 5 ] && one=0
  printf '%s\t%s\t%s\t%s\n' "$label" "$one" "$((SECONDS - started))" "$xml" >>"$work/status"
}
failed() {  # label: a step that is not a pytest run failed
  printf '%s\t1\t0\t-\n' "$1" >>"$work/status"
}

mark_of() {  # index -> the -m of that interpreter ("" for everything)
  if [ "$1" -gt 0 ]; then echo "${PYTHONS_MARK-not slow}"; fi
}
label_of() {  # index [what]
  echo "Python $(version_of "${pythons[$1]}") (${venvs[$1]}${2:+, $2})"
}
run_other() {  # index: that interpreter's lane, once its venv is installed
  local i=$1 mark
  shift
  mark=$(mark_of "$i")
  if ! await_install "$i"; then
    failed "$(label_of "$i" "pip install")"
  elif [ "$workers" != 0 ] && [ "$mark" = "not slow" ]; then
    lane "$(label_of "$i" "not slow, $workers processes")" "${venvs[$i]}" -m "not slow" -n "$workers" "$@"
  elif [ -n "$mark" ]; then
    lane "$(label_of "$i" "-m \"$mark\"")" "${venvs[$i]}" -m "$mark" "$@"
  else
    lane "$(label_of "$i")" "${venvs[$i]}" "$@"
  fi
}
alongside() {
  if [ -n "${TEST_ALONGSIDE:-}" ]; then
    echo "== $TEST_ALONGSIDE" >&2
    bash -c "$TEST_ALONGSIDE" || failed "$TEST_ALONGSIDE"
  fi
}
beside() {  # what runs beside the first interpreter's slow drills (at nice 19)
  lowest_priority
  lane "$(label_of 0 "not slow, $workers processes")" "${venvs[0]}" -m "not slow" -n "$workers" "$@"
  local i
  for i in "${!venvs[@]}"; do
    if [ "$i" -gt 0 ] && [ "$(mark_of "$i")" = "not slow" ]; then run_other "$i" "$@"; fi
  done
  alongside
}

if [ "$workers" = 0 ]; then   # one plain run each, one after another
  lane "$(label_of 0)" "${venvs[0]}" "$@"
  for i in "${!venvs[@]}"; do [ "$i" -gt 0 ] && run_other "$i" "$@"; done
  alongside
else
  if [ "$overlap" = 1 ]; then
    beside "$@" >"$work/beside.log" 2>&1 &
    side=$!
    cleanups+=('kill "$side" 2>/dev/null')
    echo "test.sh: the \`not slow\` lanes run beside the slow drills (nice 19); their log follows" >&2
  else
    lane "$(label_of 0 "not slow, $workers processes")" "${venvs[0]}" -m "not slow" -n "$workers" "$@"
  fi
  # the slow drills on servers of their own that mostly wait (conftest.py SLOW_BESIDE): at
  # nice 10 beside the others (alone when the lanes do not overlap). Native tracebacks:
  # formatting one of their failures, pytest's long form (ast.parse of the source) hit a
  # CPython 3.11 SystemError and the run ended in INTERNALERROR without naming the failure
  if [ "$overlap" = 1 ]; then
    (renice -n 10 -p "$BASHPID" >/dev/null
     lane "$(label_of 0 "slow, beside at nice 10: slow_beside")" "${venvs[0]}" \
       -m "slow and slow_beside" --tb=native "$@") >"$work/slow-beside.log" 2>&1 &
    slow_side=$!
    cleanups+=('kill "$slow_side" 2>/dev/null')
  else
    lane "$(label_of 0 "slow: slow_beside")" "${venvs[0]}" -m "slow and slow_beside" "$@"
  fi
  # the slow drills that hold no timing margin (conftest.py SLOW_PARALLEL) two at a time,
  # a module per process; then every other one alone
  lane "$(label_of 0 "slow, 2 processes: slow_parallel")" "${venvs[0]}" \
    -m "slow and slow_parallel" -n 2 --dist loadfile "$@"
  lane "$(label_of 0 "slow, one at a time")" "${venvs[0]}" \
    -m "slow and not slow_parallel and not slow_beside" "$@"
  if [ "$overlap" = 1 ]; then
    wait "$slow_side" || failed "the slow drills beside the others"
    cat "$work/slow-beside.log" >&2
    wait "$side" || failed "the lanes beside the slow drills"
    cat "$work/beside.log" >&2
  fi
  for i in "${!venvs[@]}"; do
    if [ "$i" -gt 0 ] && { [ "$overlap" = 0 ] || [ "$(mark_of "$i")" != "not slow" ]; }; then
      run_other "$i" "$@"
    fi
  done
  [ "$overlap" = 1 ] || alongside
fi

# -- the summary: every run's status and time, the 15 slowest tests of them all ---------
"${venvs[0]}/bin/python" - "$work/status" <<'EOF' >&2 || true
import sys
import xml.etree.ElementTree as ET

rows, lines = [], []
for line in open(sys.argv[1], encoding="utf-8"):
    label, status, seconds, xml = line.rstrip("\n").split("\t")
    lines.append(f"{label}: {'passed' if status == '0' else f'FAILED (exit {status})'}"
                 f" ({seconds} s)")
    try:
        cases = ET.parse(xml).getroot().iter("testcase")
    except (OSError, ET.ParseError):
        continue
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        rows.append((float(case.get("time") or 0), name, label))
print("test.sh: the 15 slowest tests (setup + call + teardown, s):")
for took, name, label in sorted(rows, reverse=True)[:15]:
    print(f"{took:8.1f}  {name}  [{label}]")
print("\n".join(lines))
EOF
rc=0
while IFS=$'\t' read -r _ one _ _; do
  [ "$one" = 0 ] || rc=$one
done <"$work/status"
exit "$rc"
