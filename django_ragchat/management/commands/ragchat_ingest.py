"""``manage.py ragchat_ingest PATH...``: load, chunk, embed and store documents.

See docs/commands.md. Failures are listed one per line on stderr ("path: reason"); the last
line on stdout has the counts and the elapsed time. The exit status is non-zero only when no
document was found or every one failed: a run that stored some documents succeeded.

On PostgreSQL the command then builds the HNSW index of every embedding space that has none
(once, at the end of the bulk load: faster than growing it row by row); pgvector keeps it up
to date after that. ``ragchat_index`` remains for repairs and rebuilds.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import connections, router

from django_ragchat.access import InvalidAccess, access_tokens
from django_ragchat.ingestion.loaders import SUPPORTED_SUFFIXES
from django_ragchat.ingestion.pipeline import FAILED, ingest_paths
from django_ragchat.management.progress import progress_bar
from django_ragchat.models import Chunk, Document
from django_ragchat.search import postgres


class Command(BaseCommand):
    help = ("Ingest Markdown, reStructuredText, HTML and text files (or folders of them) into the "
            "documents the assistant searches. Unchanged files are skipped.")

    def add_arguments(self, parser):
        parser.add_argument("paths", nargs="+", metavar="PATH", help="Files or folders (walked recursively).")
        parser.add_argument("--profile", help="Embed with this profile's embedder (default: the default profile).")
        parser.add_argument("--root", metavar="DIR",
                            help="Store sources relative to this folder (default: relative to the current folder "
                                 "when inside it, else absolute).")
        parser.add_argument("--metadata", metavar="JSON",
                            help='A JSON object stored on every document, e.g. \'{"product": "aurora"}\'.')
        parser.add_argument("--access", action="append", metavar="WHO",
                            help="Who may read these documents (default: everyone): staff, authenticated, user:<id>, "
                                 "group:<id> or app_label.codename (a permission); repeat or separate with commas.")
        parser.add_argument("--batch-size", type=int, default=64, metavar="N",
                            help="Texts per embedding call (default 64).")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar.")

    def handle(self, *args, **options):
        metadata = _metadata(options["metadata"])
        access = _access(options["access"])
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1.")
        with progress_bar(self, off=options["no_progress"], unit="doc", desc="Ingesting") as progress:
            try:
                report = ingest_paths(options["paths"], profile=options["profile"], root=options["root"],
                                      metadata=metadata, progress=progress, batch_size=options["batch_size"],
                                      access=access)
            except (ValueError, ImproperlyConfigured) as exc:
                raise CommandError(str(exc)) from None

        for result in report.failed:
            self.stderr.write(f"{result.path or result.source}: {result.reason}")
        if not report.results:
            raise CommandError(
                f"No documents found in {' '.join(options['paths'])} "
                f"(supported: {', '.join(sorted(SUPPORTED_SUFFIXES))})."
            )
        if report.count(FAILED) < len(report.results):
            build_missing_indexes(self.stdout)
        self._warn_of_copies(report)
        self.stdout.write(f"Ingested {report.summary()}")  # the last line: the counts
        if report.count(FAILED) == len(report.results):
            raise CommandError("Every document failed to ingest.")



    def _warn_of_copies(self, report) -> None:
        """Name documents just created that repeat a stored file: the same bytes and file name
        under another source, as ingesting from another working folder stores them."""
        copies = stored_copies([r for r in report.results if r.status == "created"])
        if not copies:
            return
        examples = "; ".join(f"{new} = {old}" for new, old in copies[:3]) + ("; …" if len(copies) > 3 else "")
        self.stderr.write(
            f"{len(copies)} new document(s) repeat a file stored under another path ({examples}). Sources are "
            "relative to the working folder: ingest from the same folder each time, or pass --root; delete "
            "the copies in the admin (Documents).")


def stored_copies(created, batch: int = 500) -> list[tuple[str, str]]:
    """(new source, stored source) for each of ``created`` (ingest results) whose bytes and
    file name a document stored under another source has. Two queries per ``batch`` results."""
    copies = []
    for start in range(0, len(created), batch):
        ids = [r.document_id for r in created[start:start + batch] if r.document_id]
        new = dict(Document.objects.filter(pk__in=ids).exclude(checksum="").values_list("source", "checksum"))
        stored = Document.objects.filter(checksum__in=set(new.values())).values_list("checksum", "source")
        by_checksum: dict[str, list[str]] = {}
        for checksum, source in stored.order_by("source"):
            if source not in new:
                by_checksum.setdefault(checksum, []).append(source)
        for source, checksum in sorted(new.items()):
            name = PurePosixPath(source).name
            copies += [(source, old) for old in by_checksum.get(checksum, ()) if PurePosixPath(old).name == name]
    return copies


def build_missing_indexes(stdout) -> None:
    """On PostgreSQL, build the HNSW index of every embedding space that has none (once, after a
    bulk load: faster than growing it row by row); say so on ``stdout``."""
    using = router.db_for_write(Chunk)
    if connections[using].vendor != "postgresql":
        return  # SQLite searches in process; nothing to build
    for space, seconds in postgres.build_missing_hnsw_indexes(using=using):
        stdout.write(f"Built the HNSW index of space {space!r} in {seconds:.1f} s")


def _access(given: list[str] | None) -> list[str] | None:
    """``--access``, as stored tokens (``None``: everyone)."""
    if not given:
        return None
    try:
        return list(access_tokens([token for value in given for token in value.replace(",", " ").split()]))
    except InvalidAccess as exc:
        raise CommandError(f"--access: {exc}") from None


def _metadata(given: str | None) -> dict | None:
    """``--metadata``, read as a JSON object."""
    if given is None:
        return None
    try:
        metadata = json.loads(given)
    except json.JSONDecodeError as exc:
        raise CommandError(f"--metadata is not valid JSON: {exc}") from None
    if not isinstance(metadata, dict):
        raise CommandError("--metadata must be a JSON object, e.g. '{\"product\": \"aurora\"}'.")
    return metadata
