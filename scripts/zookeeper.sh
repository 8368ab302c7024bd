#!/usr/bin/env bash
# ZooKeeper on 127.0.0.1 for development and CI (see docs/choosing-allocators.md and
# plugins/flakekit-zookeeper/README.md).
#
#   zookeeper.sh start            install Debian's zookeeper if missing; start a standalone
#                                 server (port 2181, or a free one) with a temporary data dir
#   zookeeper.sh ensemble-start   start a 3-node ensemble on loopback (client ports 12181-12183,
#                                 or free ones)
#   zookeeper.sh ensemble-stop    stop the ensemble
#   zookeeper.sh stop             stop everything this script started
#   zookeeper.sh status           print the env file
#
# Everything lives under ${FLAKEKIT_SVC_DIR:-/tmp/flakekit-svc}; its file `env` holds
# ZK_HOSTS=127.0.0.1:PORT and ZK_ENSEMBLE_HOSTS=... (empty unless the ensemble runs).
set -euo pipefail

SVC=${FLAKEKIT_SVC_DIR:-/tmp/flakekit-svc}
ZK_JAR=/usr/share/java/zookeeper.jar
ENV_FILE="$SVC/env"

log() { echo "zookeeper.sh: $*" >&2; }

# ---- helpers ------------------------------------------------------------------------------
# shellcheck source=scripts/svc_lib.sh
. "$(dirname "$0")/svc_lib.sh"   # listening, free_port, alive, ours, stop_pidfile, env_get, env_set,
#                                  wait_members, apt_install, run_command

zk4() {  # four-letter word without nc
  timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/$1 && printf %s "$2" >&3 && cat <&3' _ "$1" "$2" 2>/dev/null || true
}

install_zookeeper() {
  [ -f "$ZK_JAR" ] && command -v java >/dev/null && return 0
  log "installing Debian's zookeeper package"
  apt_install zookeeper
  [ -f "$ZK_JAR" ] || { log "the zookeeper package did not install $ZK_JAR"; exit 1; }
}

write_cfg() {  # dir client_port [server lines...]
  local dir=$1 port=$2; shift 2
  rm -rf "$dir/data"; mkdir -p "$dir/data"
  cat > "$dir/zoo.cfg" <<CFG
tickTime=500
initLimit=10
syncLimit=5
dataDir=$dir/data
clientPort=$port
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr,conf,cons,wchs,dump,envi
minSessionTimeout=1000
maxSessionTimeout=60000
forceSync=no
CFG
  local line
  for line in "$@"; do echo "$line" >> "$dir/zoo.cfg"; done
  cat > "$dir/log4j.properties" <<'LOG'
log4j.rootLogger=INFO,CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
LOG
}

launch() {  # dir: start the server of dir/zoo.cfg, pid in dir/zk.pid
  local dir=$1
  # nohup on its own line, so $! is the java process (backends.md gotcha)
  nohup java -Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.net.preferIPv4Stack=true \
    -Dlog4j.configuration="file:$dir/log4j.properties" \
    -cp "$ZK_JAR:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar" \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" > "$dir/zk.log" 2>&1 < /dev/null &
  echo $! > "$dir/zk.pid"
}

wait_ready() {  # port pidfile: ruok=imok and srvr reports a Mode
  local port=$1 pidfile=$2 i
  for i in $(seq 300); do
    if [ "$(zk4 "$port" ruok)" = imok ] && zk4 "$port" srvr | grep -q '^Mode: '; then
      return 0
    fi
    alive "$(cat "$pidfile" 2>/dev/null)" || { log "server on port $port died; see ${pidfile%/*}/zk.log"; tail -n 20 "${pidfile%/*}/zk.log" >&2; return 1; }
    sleep 0.1
  done
  log "server on port $port not ready after 30 s; see ${pidfile%/*}/zk.log"
  return 1
}

write_env() {  # standalone_hosts ensemble_hosts (other services' lines are kept)
  env_set "ZK_HOSTS=$1" "ZK_ENSEMBLE_HOSTS=$2"
}

# ---- commands -----------------------------------------------------------------------------
cmd_start() {
  local dir="$SVC/zk" port
  mkdir -p "$SVC"
  if ours "$dir/zk.pid"; then
    port=$(sed -n 's/^clientPort=//p' "$dir/zoo.cfg")
    if wait_ready "$port" "$dir/zk.pid"; then
      log "already running on 127.0.0.1:$port"
      write_env "127.0.0.1:$port" "$(env_get ZK_ENSEMBLE_HOSTS)"
      return 0
    fi
    stop_pidfile "$dir/zk.pid"
  fi
  install_zookeeper
  port=$(free_port 2181)
  write_cfg "$dir" "$port"
  launch "$dir"
  wait_ready "$port" "$dir/zk.pid"
  write_env "127.0.0.1:$port" "$(env_get ZK_ENSEMBLE_HOSTS)"
  log "standalone server ready on 127.0.0.1:$port (data in $dir/data)"
}

cmd_ensemble_start() {
  local base="$SVC/zk-ensemble" n ports=() quorum=() election=() lines=() hosts=""
  mkdir -p "$base"
  install_zookeeper
  cmd_ensemble_stop quiet
  # client ports from 12181, quorum/election ports from 12881; each one free and distinct
  local next=12181
  for n in 1 2 3; do ports[n]=$(free_port "$next"); next=$((ports[n] + 1)); done
  next=12881
  for n in 1 2 3; do
    quorum[n]=$(free_port "$next"); next=$((quorum[n] + 1))
    election[n]=$(free_port "$next"); next=$((election[n] + 1))
  done
  for n in 1 2 3; do
    lines+=("server.$n=127.0.0.1:${quorum[n]}:${election[n]}")
  done
  for n in 1 2 3; do
    write_cfg "$base/n$n" "${ports[n]}" "${lines[@]}"
    echo "$n" > "$base/n$n/data/myid"
  done
  for n in 1 2 3; do launch "$base/n$n"; done
  hosts=$(wait_members "$base/n%s/zk.pid" "${ports[@]}")
  write_env "$(env_get ZK_HOSTS)" "$hosts"
  log "3-node ensemble ready on $hosts"
}

cmd_ensemble_stop() {
  local base="$SVC/zk-ensemble" n
  for n in 1 2 3; do stop_pidfile "$base/n$n/zk.pid" & done
  wait
  rm -rf "$base"
  if [ -f "$ENV_FILE" ]; then write_env "$(env_get ZK_HOSTS)" ""; fi
  [ "${1:-}" = quiet ] || log "ensemble stopped"
}

cmd_stop() {
  stop_pidfile "$SVC/zk/zk.pid" &
  cmd_ensemble_stop quiet
  wait
  rm -rf "$SVC/zk"
  if [ -f "$ENV_FILE" ]; then   # other services' lines stay
    sed -i '/^ZK_HOSTS=/d; /^ZK_ENSEMBLE_HOSTS=/d' "$ENV_FILE"
    [ -s "$ENV_FILE" ] || rm -f "$ENV_FILE"
  fi
  log "stopped"
}

run_command ensemble "$@"
