#!/usr/bin/env bash
# pip install into a venv, quietly: `bash scripts/pip-install.sh .venv -e '.[test]' ...`.
# The pip config of these machines names per-package index folders that mostly do not
# exist, and pip warns once per package ("WARNING: Location '...' is ignored: it is neither
# a file nor a directory"): dozens of lines per install that bury the line that matters when
# an install fails. Those are dropped; everything else pip prints is kept, and its exit status.
set -euo pipefail
venv=$1
shift
{ "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 1>&3 3>&- \
    | { grep -v "^WARNING: Location '[^']*' is ignored: it is neither a file nor a directory" || true; } >&2
} 3>&1
