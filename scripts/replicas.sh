#!/usr/bin/env bash
# A throw-away PostgreSQL 15 primary + streaming standby (or a MariaDB primary + GTID
# replica) on loopback for fail-over drills by hand (the tests start their own: tests/test_failover_drills.py, flakekit.testing.replicas).
# Replication runs through a proxy this script can cut; clients connect through a second
# proxy that `failover` re-points at the promoted standby, as a VIP would.
#
#   replicas.sh start [postgresql|mariadb]
#                          PostgreSQL (default): initdb + pg_basebackup -R on free ports;
#                          MariaDB: two servers, the replica on MASTER_USE_GTID=slave_pos;
#                          prints the env file
#   replicas.sh cut        cut the replication (the primary keeps accepting commits)
#   replicas.sh failover   kill -9 the primary, promote the standby (MariaDB: STOP SLAVE;
#                          RESET SLAVE ALL; SET GLOBAL read_only=0), re-point the clients
#   replicas.sh stop       stop everything this script started
#   replicas.sh status     print the env file
#
# State lives under ${FLAKEKIT_SVC_DIR:-/tmp/flakekit-svc}/replicas; its file `env` holds
# FLAKEKIT_REPLICAS_URL (through the client proxy), ..._PRIMARY_URL and ..._STANDBY_URL.
# Needs PostgreSQL's server binaries (FLAKEKIT_PG_BIN, default /usr/lib/postgresql/15/bin)
# or mariadbd and mariadb-install-db, and the project's venv (PYTHON, default .venv/bin/python).
set -euo pipefail

SVC=${FLAKEKIT_SVC_DIR:-/tmp/flakekit-svc}/replicas
ENV_FILE="$SVC/env"
PIDFILE="$SVC/replicas.pid"
PYTHON=${PYTHON:-$(dirname "$0")/../.venv/bin/python}

log() { echo "replicas.sh: $*" >&2; }

# shellcheck source=scripts/svc_lib.sh
. "$(dirname "$0")/svc_lib.sh"   # alive, stop_pidfile

running() { local pid; pid=$(cat "$PIDFILE" 2>/dev/null) && alive "$pid"; }

case "${1:-}" in
  start)
    if running; then cat "$ENV_FILE"; exit 0; fi
    mkdir -p "$SVC"; rm -f "$ENV_FILE"
    nohup "$PYTHON" -m flakekit.testing.replicas "$ENV_FILE" "${2:-postgresql}" > "$SVC/replicas.log" 2>&1 < /dev/null &
    echo $! > "$PIDFILE"
    for _ in $(seq 600); do
      [ -s "$ENV_FILE" ] && { cat "$ENV_FILE"; exit 0; }
      running || { log "failed to start: $(tail -n 5 "$SVC/replicas.log")"; exit 1; }
      sleep 0.1
    done
    log "not up after 60 s: $SVC/replicas.log"; exit 1 ;;
  cut)      running || { log "not running"; exit 1; }; kill -USR1 "$(cat "$PIDFILE")" ;;
  failover) running || { log "not running"; exit 1; }; kill -USR2 "$(cat "$PIDFILE")" ;;
  stop)
    if running; then
      pid=$(cat "$PIDFILE"); kill "$pid"
      for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
    fi
    rm -f "$PIDFILE" "$ENV_FILE" ;;
  status)   cat "$ENV_FILE" 2>/dev/null || log "not running" ;;
  *) echo "usage: $0 start [postgresql|mariadb]|cut|failover|stop|status" >&2; exit 2 ;;
esac
