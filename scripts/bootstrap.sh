#!/usr/bin/env bash
# Creates .venv (if missing) and installs django-ragchat with its development extras into it.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.ragchat-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp || -n $(find plugins -name pyproject.toml -newer "$stamp") ]]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[dev]"
  # The optional plugins in plugins/ are separate distributions; install them for their tests.
  .venv/bin/python -m pip install --quiet --no-deps --no-build-isolation \
    -e plugins/ragchat-lexical-rerank -e plugins/ragchat-pii-guard -e plugins/ragchat-prompt-guard
  touch "$stamp"
fi
