#!/usr/bin/env bash
# Starts the local PostgreSQL cluster and Redis when they are not running, then waits until both
# answer (at most 30 s each). Idempotent: a second run only checks. Needs root (or the services'
# owners) to start them; checking alone needs nothing.
set -euo pipefail

pg_ready() { pg_isready -q -h 127.0.0.1 -p 5432; }
redis_ready() { [[ $(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null) == PONG ]]; }

wait_for() {
  local name=$1 probe=$2
  for _ in $(seq 1 60); do
    if $probe; then echo "$name is up"; return 0; fi
    sleep 0.5
  done
  echo "$name did not answer within 30 s" >&2
  return 1
}

if ! pg_ready; then
  version=$(ls /etc/postgresql | sort -n | tail -n 1)
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
fi
wait_for PostgreSQL pg_ready

if ! redis_ready; then
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
wait_for Redis redis_ready
