#!/usr/bin/env bash
# Sets up and runs the demo on the embedded defaults: SQLite, the semantic embedder shipped in the
# wordllama wheel (the semantic extra, which bootstrap.sh installs with the dev extras) and the
# offline answerer. No network, no API key, no model download. Set DATABASE_URL to run it on PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
PY=.venv/bin/python
# The demo's own key and plain HTTP (example_project/settings.py refuses both without this).
export DJANGO_DEBUG=${DJANGO_DEBUG:-1}
$PY manage.py migrate --no-input
# The shop's products come from its Product model (example_project/shop/, indexed through the
# model sources of shop/ragchat.py; later edits in the admin are indexed as they are saved).
$PY manage.py ragchat_sync
# The shop's policies stay a document: the sample policies page only (the project's own docs/
# are not the demo's subject, and a product question must never cite them).
$PY manage.py ragchat_ingest example_project/sample_docs/support.md --root .
echo
echo "Open http://127.0.0.1:${PORT:-8000}/ and ask: How much does the Aurora X2 cost?"
if [[ -z ${RAGCHAT_LLM_BASE_URL:-}${OPENAI_API_KEY:-} ]]; then
  echo "Answers are extractive (quoted from the documents) until a model is configured: set"
  echo "RAGCHAT_LLM_BASE_URL (or OPENAI_API_KEY), RAGCHAT_CHAT_MODEL and RAGCHAT_EMBEDDING_MODEL."
fi
exec $PY manage.py runserver "127.0.0.1:${PORT:-8000}"
