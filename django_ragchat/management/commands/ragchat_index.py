"""``manage.py ragchat_index``: create or verify the search indexes of this database.

PostgreSQL: one HNSW index per embedding space that has chunks (``halfvec`` above 2,000
dimensions), and a GIN expression index for every text search configuration a profile's
``fulltext``/``hybrid`` retriever uses besides the ``english`` column's. SQLite: the FTS5 table
and its triggers (re-created after a migration rebuilt the chunk table). See
docs/postgresql.md. ``--check`` changes nothing and exits non-zero when an index is missing.
"""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, connections

from django_ragchat.search import configured_text_configs, postgres, sqlite


class Command(BaseCommand):
    help = "Create (or with --check, verify) the vector and full-text search indexes."

    def add_arguments(self, parser):
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS, help="Database alias (default: default).")
        parser.add_argument("--check", action="store_true",
                            help="Change nothing; exit with an error if an index is missing or invalid.")
        parser.add_argument("--space", action="append", metavar="SPACE",
                            help="Only this embedding space (repeatable; default: every space with chunks).")
        parser.add_argument("--rebuild", action="store_true", help="Drop and build the HNSW indexes again.")
        parser.add_argument("--concurrently", action="store_true",
                            help="PostgreSQL: build without blocking writes (slower; not in a transaction).")
        parser.add_argument("--m", type=int, default=16, help="HNSW links per node (default 16).")
        parser.add_argument("--ef-construction", type=int, default=64,
                            help="HNSW candidate list while building (default 64).")
        parser.add_argument("--maintenance-work-mem", metavar="SIZE",
                            help="PostgreSQL memory for the build, e.g. 1GB (default: what the space needs, "
                                 "up to 2GB, never below the server's setting).")

    def handle(self, *args, **options):
        using = options["database"]
        vendor = connections[using].vendor
        problems = self._postgres(using, options) if vendor == "postgresql" else self._sqlite(using, options)
        if problems:
            raise CommandError(f"{problems} index(es) missing or invalid; run `manage.py ragchat_index` "
                               f"without --check to create them.")

    def _postgres(self, using, options) -> int:
        counts = postgres.spaces(using)
        wanted = options["space"] or list(counts)
        unknown = sorted(set(wanted) - set(counts))
        if unknown:
            raise CommandError(f"No chunks in space(s) {unknown}; spaces with chunks: {sorted(counts) or 'none'}.")
        problems = 0
        for space in wanted:
            status = postgres.hnsw_index_status(space, using=using)
            label = f"{space}: {counts[space]:,} chunks, {status.dimensions} dimensions"
            if status.state == "unindexable":
                self.stdout.write(f"{label}: too many dimensions for HNSW; searched exactly")
                continue
            if options["check"] or (status.ok and not options["rebuild"]):
                self.stdout.write(f"{label}: HNSW index {status.name} {status.state}")
                problems += not status.ok
                continue
            started = time.perf_counter()
            try:
                status, _ = postgres.create_hnsw_index(
                    space, m=options["m"], ef_construction=options["ef_construction"],
                    concurrently=options["concurrently"], rebuild=options["rebuild"],
                    maintenance_work_mem=options["maintenance_work_mem"], using=using,
                )
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            kind = postgres.vector_type(status.dimensions)
            self.stdout.write(f"{label}: HNSW index {status.name} ({kind}) built in "
                              f"{time.perf_counter() - started:.1f} s")
        for config in sorted({postgres.COLUMN_CONFIG} | configured_text_configs()):
            status = postgres.fulltext_index_status(config, using)
            if not status.ok and not options["check"]:
                status, _ = postgres.create_fulltext_index(config, concurrently=options["concurrently"], using=using)
            self.stdout.write(f"full text ({config}): GIN index {status.name} {status.state}")
            problems += not status.ok
        return problems

    def _sqlite(self, using, options) -> int:
        self.stdout.write("Vector search runs in process on this database: no vector index to build.")
        if connections[using].vendor != "sqlite":
            return 0
        state = sqlite.fulltext_state(using)
        if state == "unavailable":
            self.stdout.write("full text: unavailable (this SQLite was built without FTS5)")
            return 0
        if (state == "missing" or options["rebuild"]) and not options["check"]:
            sqlite.create_fulltext(using)
            state = sqlite.fulltext_state(using) + " (built from the chunks)"
        self.stdout.write(f"full text: FTS5 index {state}")
        return int(state == "missing")
