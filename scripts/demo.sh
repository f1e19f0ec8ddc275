#!/usr/bin/env bash
# Sets up and runs the demo on the embedded defaults: SQLite, offline embedder and answerer.
# No network, no API key, no model download. Set DATABASE_URL to run it on PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
PY=.venv/bin/python
# The demo's own key and plain HTTP (example_project/settings.py refuses both without this).
export DJANGO_DEBUG=${DJANGO_DEBUG:-1}
$PY manage.py migrate --no-input
$PY manage.py ragchat_ingest docs example_project/sample_docs --root .
echo
echo "Open http://127.0.0.1:${PORT:-8000}/ and ask: How much does the Aurora X2 cost?"
exec $PY manage.py runserver "127.0.0.1:${PORT:-8000}"
