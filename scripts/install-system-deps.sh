#!/usr/bin/env bash
# System packages the test suite needs, from Debian: Chromium and its driver (browser tests),
# then pgvector built for the local PostgreSQL (scripts/install-pgvector.sh). Needs root.
# Idempotent and quick when everything is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium chromium-driver >/dev/null
fi
bash scripts/install-pgvector.sh
