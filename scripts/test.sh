#!/usr/bin/env bash
# The test command: the whole suite on SQLite, then again on PostgreSQL with pgvector.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k pipeline`).
# Needs: the services (scripts/ensure-services.sh), pgvector (scripts/install-pgvector.sh) and
# Chromium (scripts/install-system-deps.sh); .ci/run installs all of them first.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh || exit 1
PY=.venv/bin/python
PG_URL=${RAGCHAT_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/ragchat}

run() {
  local label=$1; shift
  echo "=== tests on $label ==="
  "$@"
  local rc=$?
  # pytest exits 5 when it collected no test: that is a failure of the suite, not a pass.
  if [[ $rc -eq 5 ]]; then echo "no tests were collected on $label"; return 1; fi
  return $rc
}

status=0
run SQLite env -u DATABASE_URL "$PY" -m pytest "$@" || status=1
# On PostgreSQL, a missing server or extension is an error, never a skip.
run PostgreSQL env DATABASE_URL="$PG_URL" RAGCHAT_REQUIRE_POSTGRES=1 "$PY" -m pytest "$@" || status=1
exit $status
