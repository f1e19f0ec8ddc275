#!/usr/bin/env bash
# Creates a virtual environment (if missing) and installs django-ragchat with its development
# extras into it. Idempotent: a second run only checks that everything is installed.
#
#   bash scripts/bootstrap.sh                       # .venv: python3 (3.11+), Django 5.2 LTS
#   VENV=.venv-django61 PYTHON=python3.12 DJANGO="Django>=6.1,<6.2" bash scripts/bootstrap.sh
#
# scripts/test.sh creates both environments of the support matrix this way. Versions come from
# scripts/constraints.txt (what CI last passed with); RAGCHAT_UNPINNED=1 installs the newest instead.
# To move the pins: RAGCHAT_UNPINNED=1 into a fresh VENV, run the test command, then rewrite the file
# from `pip freeze --exclude-editable` (without Django; numpy differs between Python 3.11 and 3.12+).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
DJANGO=${DJANGO:-Django>=5.2,<6.0}
constraints=(-c scripts/constraints.txt)
[[ -n ${RAGCHAT_UNPINNED:-} ]] && constraints=()
say() { echo "bootstrap [$VENV]: $*"; }

if [[ ! -x $VENV/bin/python ]]; then
  say "creating the virtual environment with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
stamp=$VENV/.ragchat-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp || scripts/constraints.txt -nt $stamp || -n $(find plugins -name pyproject.toml -newer "$stamp") \
      || $(cat "$stamp") != "$DJANGO" ]]; then
  started=$(date +%s)
  # [dev] includes [semantic]: the default profile's embedded model (the wordllama wheel).
  say "installing django-ragchat[dev] with $DJANGO (about a minute on a fresh machine; pip is quiet meanwhile)"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet "${constraints[@]}" -e ".[dev]" "$DJANGO"
  say "installing the optional plugins in plugins/ (for their tests)"
  # They are separate distributions; --no-build-isolation: offline, with the setuptools above.
  "$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation \
    -e plugins/ragchat-lexical-rerank -e plugins/ragchat-pii-guard -e plugins/ragchat-prompt-guard
  echo "$DJANGO" > "$stamp"
  say "done in $(( $(date +%s) - started )) s: $("$VENV/bin/python" -c 'import django, sys; print(f"Python {sys.version.split()[0]}, Django {django.get_version()}")')"
fi
