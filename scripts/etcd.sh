#!/usr/bin/env bash
# etcd on 127.0.0.1 for development and CI (see docs/choosing-allocators.md and
# plugins/flakekit-etcd/README.md).
#
#   etcd.sh start           install Debian's etcd-server/etcd-client if missing; start a single
#                           member (client port 2379, or a free one) with a temporary data dir
#   etcd.sh cluster-start   start a 3-member cluster on loopback (client ports from 32371,
#                           peer ports from 32381, or free ones)
#   etcd.sh cluster-stop    stop the cluster
#   etcd.sh stop            stop everything this script started
#   etcd.sh status          print the env file
#
# Everything lives under ${FLAKEKIT_SVC_DIR:-/tmp/flakekit-svc}; its file `env` (shared with
# scripts/zookeeper.sh: only the ETCD_* lines are rewritten) holds
# ETCD_ENDPOINTS=127.0.0.1:PORT and ETCD_CLUSTER_ENDPOINTS=... (empty unless the cluster runs).
# etcd reads every ETCD_* environment variable as a flag, and exits when one duplicates a
# command-line flag: the servers run under `env -i`.
set -euo pipefail

SVC=${FLAKEKIT_SVC_DIR:-/tmp/flakekit-svc}
ENV_FILE="$SVC/env"
TOKEN=flakekit-test

log() { echo "etcd.sh: $*" >&2; }

# ---- helpers ------------------------------------------------------------------------------
# shellcheck source=scripts/svc_lib.sh
. "$(dirname "$0")/svc_lib.sh"   # listening, free_port, alive, ours, stop_pidfile, env_get, env_set,
#                                  wait_members, apt_install, run_command

healthy() {  # port: GET /health answers {"health":"true"} (no curl, no nc)
  timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/$1 && printf "GET /health HTTP/1.0\r\n\r\n" >&3 && cat <&3' \
    _ "$1" 2>/dev/null | grep -q '"health":"true"'
}

install_etcd() {
  command -v etcd >/dev/null && command -v etcdctl >/dev/null && return 0
  log "installing Debian's etcd-server and etcd-client"
  apt_install etcd-server etcd-client
  command -v etcd >/dev/null || { log "the etcd-server package did not install etcd"; exit 1; }
}

launch() {  # dir name client_port peer_port initial_cluster token
  local dir=$1 name=$2 port=$3 peer=$4 cluster=$5 token=$6
  rm -rf "$dir/data"; mkdir -p "$dir"
  echo "$port" > "$dir/port"
  # env -i: no ETCD_* variable of ours reaches etcd; nohup on its own so $! is etcd
  nohup env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$dir" \
    etcd --name "$name" --data-dir "$dir/data" \
      --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
      --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
      --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "$token" \
      --logger zap --log-outputs stderr --log-level warn \
    > "$dir/etcd.log" 2>&1 < /dev/null &
  echo $! > "$dir/etcd.pid"
}

wait_ready() {  # port pidfile
  local port=$1 pidfile=$2 i
  for i in $(seq 300); do
    healthy "$port" && return 0
    alive "$(cat "$pidfile" 2>/dev/null)" || { log "member on port $port died; see ${pidfile%/*}/etcd.log"; tail -n 20 "${pidfile%/*}/etcd.log" >&2; return 1; }
    sleep 0.1
  done
  log "member on port $port not healthy after 30 s; see ${pidfile%/*}/etcd.log"
  return 1
}

# ---- commands -----------------------------------------------------------------------------
cmd_start() {
  local dir="$SVC/etcd" port peer
  mkdir -p "$SVC"
  if ours "$dir/etcd.pid"; then
    port=$(cat "$dir/port")
    if wait_ready "$port" "$dir/etcd.pid"; then
      log "already running on 127.0.0.1:$port"
      env_set "ETCD_ENDPOINTS=127.0.0.1:$port" "ETCD_CLUSTER_ENDPOINTS=$(env_get ETCD_CLUSTER_ENDPOINTS)"
      return 0
    fi
    stop_pidfile "$dir/etcd.pid" 20
  fi
  install_etcd
  port=$(free_port 2379)
  peer=$(free_port 2380 "$port")
  launch "$dir" flakekit "$port" "$peer" "flakekit=http://127.0.0.1:$peer" "$TOKEN-$port"
  wait_ready "$port" "$dir/etcd.pid"
  env_set "ETCD_ENDPOINTS=127.0.0.1:$port" "ETCD_CLUSTER_ENDPOINTS=$(env_get ETCD_CLUSTER_ENDPOINTS)"
  log "single member ready on 127.0.0.1:$port (data in $dir/data)"
}

cmd_cluster_start() {
  local base="$SVC/etcd-cluster" n ports=() peers=() taken="" initial="" endpoints=""
  mkdir -p "$base"
  install_etcd
  cmd_cluster_stop quiet
  local next=32371
  for n in 1 2 3; do ports[n]=$(free_port "$next" "$taken"); taken+=" ${ports[n]}"; next=$((ports[n] + 1)); done
  next=32381
  for n in 1 2 3; do peers[n]=$(free_port "$next" "$taken"); taken+=" ${peers[n]}"; next=$((peers[n] + 1)); done
  for n in 1 2 3; do initial+="${initial:+,}m$n=http://127.0.0.1:${peers[n]}"; done
  for n in 1 2 3; do
    launch "$base/m$n" "m$n" "${ports[n]}" "${peers[n]}" "$initial" "$TOKEN-cluster-${ports[1]}"
  done
  endpoints=$(wait_members "$base/m%s/etcd.pid" "${ports[@]}")
  env_set "ETCD_ENDPOINTS=$(env_get ETCD_ENDPOINTS)" "ETCD_CLUSTER_ENDPOINTS=$endpoints"
  log "3-member cluster ready on $endpoints"
}

cmd_cluster_stop() {
  local base="$SVC/etcd-cluster" n
  for n in 1 2 3; do stop_pidfile "$base/m$n/etcd.pid" 20 & done
  wait
  rm -rf "$base"
  if [ -f "$ENV_FILE" ]; then
    env_set "ETCD_ENDPOINTS=$(env_get ETCD_ENDPOINTS)" "ETCD_CLUSTER_ENDPOINTS="
  fi
  [ "${1:-}" = quiet ] || log "cluster stopped"
}

cmd_stop() {
  stop_pidfile "$SVC/etcd/etcd.pid" 20 &
  cmd_cluster_stop quiet
  wait
  rm -rf "$SVC/etcd"
  if [ -f "$ENV_FILE" ]; then
    env_set "ETCD_ENDPOINTS=" "ETCD_CLUSTER_ENDPOINTS="
    sed -i '/^ETCD_ENDPOINTS=$/d; /^ETCD_CLUSTER_ENDPOINTS=$/d' "$ENV_FILE"
  fi
  log "stopped"
}

run_command cluster "$@"
