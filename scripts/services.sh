#!/usr/bin/env bash
# Make sure the database servers the tests use are up on 127.0.0.1.
# PostgreSQL 5432 (user postgres, trust, database test) and MariaDB 3306 (root, no
# password, database test) are started before work begins on the project's machines;
# elsewhere this starts them the way ../shared/notes/backends.md describes.
set -euo pipefail

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ensure_postgresql() {
  listening 5432 && return 0
  echo "services: starting PostgreSQL" >&2
  if command -v pg_ctlcluster >/dev/null; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  fi
  for _ in $(seq 100); do listening 5432 && break; sleep 0.1; done
  listening 5432 || { echo "services: PostgreSQL is not listening on 127.0.0.1:5432" >&2; return 1; }
  runuser -u postgres -- psql -qc "CREATE DATABASE test" 2>/dev/null || true
}

ensure_mariadb() {
  listening 3306 && return 0
  echo "services: starting MariaDB" >&2
  if ! command -v mariadbd >/dev/null && [ ! -x /usr/sbin/mariadbd ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends mariadb-server >/dev/null
  fi
  install -d -o mysql -g root /run/mysqld 2>/dev/null || true
  # matched by its pid file: a private mariadbd a drill runs (flakekit.testing.replicas) is not this one
  start-stop-daemon --start --oknodo --background --pidfile /run/mysqld/mysqld.pid \
    --exec /usr/sbin/mariadbd -- --user=mysql
  for _ in $(seq 100); do listening 3306 && break; sleep 0.1; done
  listening 3306 || { echo "services: MariaDB is not listening on 127.0.0.1:3306" >&2; return 1; }
  mariadb -uroot -e "CREATE DATABASE IF NOT EXISTS test" 2>/dev/null || true
}

ensure_postgresql
ensure_mariadb
