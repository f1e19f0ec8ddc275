#!/usr/bin/env bash
# The test command (README.md). On a fresh machine of this project's kind it does everything:
#   1. as root: installs what the tests need (scripts/install-system-deps.sh: Chromium, its
#      driver, PostgreSQL, Redis, pgvector) and starts PostgreSQL and Redis
#      (scripts/ensure-services.sh); not root: checks that they answer;
#   2. creates the two virtual environments of the support matrix (scripts/bootstrap.sh):
#      .venv         Python 3.11 (python3), Django 5.2 LTS
#      .venv-django61 Python 3.12, Django 6.1
#   3. ruff check (pyflakes, pycodestyle errors, isort, bugbear; config in pyproject.toml);
#   4. the whole suite on each combination, on SQLite and on PostgreSQL with pgvector, all side by side
#      (a PostgreSQL test that would skip fails there: RAGCHAT_REQUIRE_POSTGRES=1).
# pytest's exit 5 (no test collected) is a failure. Each run ends with its 15 slowest tests
# (--durations), where CI's time goes. Extra arguments go to every pytest run
# (e.g. `bash scripts/test.sh -k pipeline`). RAGCHAT_TEST_MATRIX=5.2 (or 6.1) runs one
# combination; RAGCHAT_TEST_POSTGRES_URL names the server (each run makes its own test database).
set -uo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started )) s"; }

if [[ $(id -u) -eq 0 ]]; then
  bash scripts/install-system-deps.sh || exit 1
  bash scripts/ensure-services.sh || exit 1
else
  bash scripts/ensure-services.sh || { echo "PostgreSQL or Redis is not running: run this as root once, or start them"; exit 1; }
fi

# A Python 3.12+ that really runs: pyenv's `python3.12` shim is on the PATH but fails unless
# 3.12 is pyenv's selected version, so every candidate is tried, not just found.
find_python312() {
  local candidate
  for candidate in "${RAGCHAT_PYTHON312:-}" "$(command -v python3.12 || true)" \
                   "$HOME"/.pyenv/versions/3.12*/bin/python "$(command -v python3.13 || true)" \
                   "$HOME"/.pyenv/versions/3.13*/bin/python; do
    if [[ -n $candidate ]] && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
}
python312=$(find_python312)
matrix=${RAGCHAT_TEST_MATRIX:-"5.2 6.1"}
for combo in $matrix; do
  case $combo in
    5.2) bash scripts/bootstrap.sh || exit 1 ;;
    6.1)
      if [[ -z $python312 ]]; then echo "Django 6.1 needs Python 3.12: none found (set RAGCHAT_PYTHON312)"; exit 1; fi
      VENV=.venv-django61 PYTHON=$python312 DJANGO="Django>=6.1,<6.2" bash scripts/bootstrap.sh || exit 1 ;;
    *) echo "unknown combination $combo (5.2 or 6.1)"; exit 1 ;;
  esac
done
echo "setup took $(elapsed)"

status=0
echo "=== ruff check ==="
.venv/bin/ruff check . || status=1

PG_URL=${RAGCHAT_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/ragchat}
logs=$(mktemp -d)
# One pytest run, its output kept in $logs/<slot>.log. pytest's exit 5 (it collected no test)
# is a failure of the suite, not a pass.
run() {
  local slot=$1; shift
  "$@" >"$logs/$slot.log" 2>&1
  local rc=$?
  if [[ $rc -eq 5 ]]; then echo "no tests were collected" >>"$logs/$slot.log"; rc=1; fi
  echo "$rc" >"$logs/$slot.rc"
}
show() {
  local slot=$1 label=$2
  echo "=== tests: $label ==="
  cat "$logs/$slot.log"
  [[ $(cat "$logs/$slot.rc") -eq 0 ]]
}

# Every run goes at once: the four of the matrix (two Django versions, SQLite and PostgreSQL)
# side by side. A run spends part of its time waiting on the servers, browsers and sockets it
# starts, so on 2 cores four at once end sooner than two pairs one after the other (docs/
# testing.md has the figures). Every
# live test keys its Redis entries by its own prefix and picks free ports, and every run makes
# its own test database (tests/settings.py), so runs do not meet.
# Tests marked `pairwise` (the fuzzer, the chat page in Chromium, the benchmarks' servers: 196 s
# of a 581 s run alone) go in two of the four runs, each Django version and each database once
# (tests/conftest.py). RAGCHAT_TEST_JOBS=N runs at most N at a time (RAGCHAT_TEST_SERIAL=1 is RAGCHAT_TEST_JOBS=1).
jobs=${RAGCHAT_TEST_JOBS:-4}
[[ -n ${RAGCHAT_TEST_SERIAL:-} ]] && jobs=1
python_of() { if [[ $1 == 5.2 ]]; then echo .venv/bin/python; else echo .venv-django61/bin/python; fi; }
running=0
start_run() {  # start_run SLOT CMD...: in the background, waiting while $jobs runs are going
  if (( running >= jobs )); then wait -n; running=$(( running - 1 )); fi
  run "$@" &
  running=$(( running + 1 ))
}
slots=()
for combo in $matrix; do
  py=$(python_of "$combo")
  start_run "$combo-sqlite" env -u DATABASE_URL RAGCHAT_TEST_PAIRWISE=1 "$py" -m pytest -p no:cacheprovider --durations=15 "$@"
  start_run "$combo-postgres" env DATABASE_URL="$PG_URL" RAGCHAT_REQUIRE_POSTGRES=1 RAGCHAT_TEST_PAIRWISE=1 \
    "$py" -m pytest -p no:cacheprovider --durations=15 "$@"
  slots+=("$combo")
done
echo "=== $(( ${#slots[@]} * 2 )) runs started, at most $jobs at a time ($(elapsed) so far) ==="
wait
for combo in "${slots[@]}"; do
  py=$(python_of "$combo")
  name="Django $("$py" -c 'import django; print(django.get_version())') on Python $("$py" -c 'import platform; print(platform.python_version())')"
  show "$combo-sqlite" "$name, SQLite" || status=1
  show "$combo-postgres" "$name, PostgreSQL" || status=1
done
rm -rf "$logs"
echo "=== the whole test command took $(elapsed); exit $status ==="
exit $status
