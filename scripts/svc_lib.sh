# Helpers shared by scripts/zookeeper.sh and scripts/etcd.sh, which source this file after
# setting SVC (their state directory) and ENV_FILE (the env file both write), and log();
# wait_members calls their wait_ready, run_command their cmd_* functions.

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port() {  # first port from $1 up that nobody listens on and that is not in $2 (a list)
  local p=$1 taken=" ${2:-} "
  while listening "$p" || [[ $taken == *" $p "* ]]; do p=$((p + 1)); done
  echo "$p"
}

alive() {  # pid: it exists and is not a zombie
  local pid=$1 state
  [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
  state=$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ "$state" != Z ] && [ "$state" != X ]
}

ours() {  # pidfile: its process is alive and was started from the pidfile's directory. A pid
  # file left by an earlier boot or session may name somebody else's process by now: that
  # one is never waited on, nor killed.
  local pidfile=$1 pid cmdline
  pid=$(cat "$pidfile" 2>/dev/null) && alive "$pid" || return 1
  cmdline=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmdline == *"${pidfile%/*}/"* ]]
}

stop_pidfile() {  # pidfile [tenths of a second to wait after TERM before KILL, default 50]
  local pidfile=$1 grace=${2:-50} pid i
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if ours "$pidfile"; then
    kill -CONT "$pid" 2>/dev/null || true   # a SIGSTOPped server cannot handle TERM
    kill "$pid" 2>/dev/null || true
    for i in $(seq "$grace"); do ours "$pidfile" || break; sleep 0.1; done
    ours "$pidfile" && kill -9 "$pid" 2>/dev/null || true
    for i in $(seq 20); do ours "$pidfile" || break; sleep 0.1; done
  fi
  rm -f "$pidfile"
}

env_get() {  # name: value from the env file
  [ -f "$ENV_FILE" ] || return 0
  sed -n "s/^$1=//p" "$ENV_FILE" | tail -n1
}

env_set() {  # NAME=VALUE...: rewrite those lines of the env file, keep every other line
  mkdir -p "$SVC"
  local tmp="$ENV_FILE.$$" pair names=()
  for pair in "$@"; do names+=("${pair%%=*}"); done
  {
    if [ -f "$ENV_FILE" ]; then
      local line keep name
      while IFS= read -r line || [ -n "$line" ]; do
        keep=1
        for name in "${names[@]}"; do [[ $line == "$name="* ]] && keep=0; done
        if [ "$keep" = 1 ]; then printf '%s\n' "$line"; fi
      done < "$ENV_FILE"
    fi
    for pair in "$@"; do printf '%s\n' "$pair"; done
  } > "$tmp"
  mv "$tmp" "$ENV_FILE"
}

wait_members() {  # pidfile_format port...: wait_ready each member (its pidfile is
  # pidfile_format with its number, 1 up, for %s), then print the host list of the env file,
  # 127.0.0.1:PORT,127.0.0.1:PORT,...
  local format=$1 n=0 port hosts=""; shift
  for port in "$@"; do
    n=$((n + 1))
    wait_ready "$port" "${format//%s/$n}" || return 1
    hosts+="${hosts:+,}127.0.0.1:$port"
  done
  echo "$hosts"
}

apt_install() {  # package...: install Debian packages quietly, without questions
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

run_command() {  # group command: start|stop|GROUP-start|GROUP-stop|status, the scripts' CLI
  # (GROUP is etcd's "cluster" or ZooKeeper's "ensemble"; cmd_start, cmd_stop,
  # cmd_GROUP_start and cmd_GROUP_stop are the calling script's)
  local group=$1
  case "${2:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    "$group-start") "cmd_${group}_start" ;;
    "$group-stop") "cmd_${group}_stop" ;;
    status) cat "$ENV_FILE" 2>/dev/null || log "not running" ;;
    *) echo "usage: $0 start|stop|$group-start|$group-stop|status" >&2; exit 2 ;;
  esac
}
