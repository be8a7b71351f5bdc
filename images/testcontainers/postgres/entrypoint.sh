#!/bin/sh
# A small stand-in for the official postgres image's entrypoint (see Containerfile).
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ "${1:-}" = postgres ]; then shift; else exec "$@"; fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
  pw=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pw"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pw" -E UTF8 --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pw"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  # The temporary server logs the first "ready to accept connections" line.
  pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -c unix_socket_directories=/tmp" start
  if [ "$db" != postgres ]; then
    psql -v ON_ERROR_STOP=1 -q -h /tmp -U "$user" -d postgres -c "CREATE DATABASE \"$db\"" >/dev/null
  fi
  pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/tmp "$@"
