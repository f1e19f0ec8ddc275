#!/usr/bin/env bash
# System packages the test suite needs, from Debian: PostgreSQL and Redis when missing,
# Chromium and its driver (browser tests), then pgvector built for the local PostgreSQL
# (scripts/install-pgvector.sh). Needs root.
# Idempotent and quick when everything is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
command -v pg_ctlcluster >/dev/null || missing+=(postgresql)
command -v redis-server >/dev/null || missing+=(redis-server)
if (( ${#missing[@]} )); then
  echo "installing ${missing[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
bash scripts/install-pgvector.sh
