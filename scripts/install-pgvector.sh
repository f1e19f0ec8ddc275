#!/usr/bin/env bash
# The project's copy of ../shared/recipes/install-pgvector.sh: .ci/run (through
# scripts/install-system-deps.sh) calls it; the system check ragchat.E010 points here.
# Builds and installs the pgvector extension into the local PostgreSQL server from Debian's
# source package (Debian's stable suite ships no pgvector for PostgreSQL 15). Idempotent.
# Tested on a Debian bookworm machine with PostgreSQL 15: about 10 s after the first apt run.
set -euo pipefail
PG_MAJOR=${PG_MAJOR:-$(ls /etc/postgresql | sort -n | tail -n 1)}
PG_CONFIG=/usr/lib/postgresql/$PG_MAJOR/bin/pg_config
if [[ -x $PG_CONFIG && -f $("$PG_CONFIG" --sharedir)/extension/vector.control ]]; then
  echo "pgvector already installed for PostgreSQL $PG_MAJOR"; exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "postgresql-server-dev-$PG_MAJOR" dpkg-dev make gcc >/dev/null
# A deb-src entry for the newer suite, built from the mirror this machine already uses.
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[[ -n $mirror ]] || mirror=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists"
cat >"$work/src.sources" <<SRC
Types: deb-src
URIs: $mirror
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
apt_opts=(-o Dir::Etc::sourcelist="$work/src.sources" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$work/lists")
apt-get "${apt_opts[@]}" update -qq
(cd "$work" && apt-get "${apt_opts[@]}" source --download-only pgvector >/dev/null 2>&1)
tar -C "$work" -xzf "$work"/pgvector_*.orig.tar.gz
src=$(find "$work" -maxdepth 1 -type d -name 'pgvector-*' | head -n 1)
make -C "$src" -j"$(nproc)" PG_CONFIG="$PG_CONFIG" >/dev/null
make -C "$src" install PG_CONFIG="$PG_CONFIG" >/dev/null
echo "pgvector installed for PostgreSQL $PG_MAJOR"
