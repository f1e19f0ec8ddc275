"""``manage.py ragchat_reembed``: embed the stored chunks into another embedding space, so a
site can change its embedding model without a migration and without downtime.

The procedure (docs/postgresql.md, "Changing the embedding model"):

1. ``ragchat_reembed --embedder NAME --options '{...}'`` (or ``--profile`` naming a profile
   that already uses the new embedder) copies every document's chunks into the new space with
   new vectors, in batches, one transaction per document, while the profiles keep answering
   from the old space. It resumes where it stopped if interrupted, and on PostgreSQL builds
   the new space's HNSW index at the end (once, which is much faster than growing it).
2. Switch: point the profile at the new embedder in settings and deploy. Queries now go to
   the new space, which is complete.
3. ``ragchat_reembed --drop-space OLD`` deletes the old space's chunks and index (it refuses
   while a profile still uses that space).

``--list`` shows every space: its chunks, its index, and the profiles that use it.

``--analysis`` (with ``--profile``, default the default profile) stores the extractive
answerer's reading of each chunk of the profile's space again where it is missing or stale
(``Chunk.analysis``, django_ragchat/answerer/stored.py): after an upgrade or an edit of the
language files a turn reads such chunks from their text, which is slower, until this runs.
Ingestion and re-embedding store it themselves.
"""

from __future__ import annotations

import json

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from django.db.models import Count
from django.utils.translation import ngettext
from tqdm import tqdm

from django_ragchat import plugins, tasks
from django_ragchat.ingestion.pipeline import reembed, refresh_analyses
from django_ragchat.models import Chunk
from django_ragchat.plugins import embedder_for
from django_ragchat.profiles import get_profile
from django_ragchat.search import configured_spaces, postgres

DELETE_BATCH_SIZE = 2000


class Command(BaseCommand):
    help = ("Embed the stored chunks into another embedding space (a new embedding model) while the "
            "current one keeps serving; --drop-space removes an old space.")

    def add_arguments(self, parser):
        target = parser.add_mutually_exclusive_group()
        target.add_argument("--profile", help="Embed into this profile's embedder's space (default: the default profile).")
        target.add_argument("--embedder", help="Embed with this registered embedder (see --options).")
        target.add_argument("--drop-space", metavar="SPACE", help="Delete this space's chunks and index.")
        target.add_argument("--list", action="store_true", help="List the spaces, their chunks and who uses them.")
        parser.add_argument("--analysis", action="store_true",
                            help="Store the answerer's reading of the profile's chunks again where it is missing or "
                                 "stale (after an upgrade or a change of the language files); nothing is embedded "
                                 "into another space.")
        parser.add_argument("--options", metavar="JSON", help='The embedder\'s options, e.g. \'{"dimension": 256}\'.')
        parser.add_argument("--batch-size", type=int, default=64, metavar="N", help="Texts per embedding call (default 64).")
        parser.add_argument("--no-index", action="store_true", help="PostgreSQL: do not build the HNSW index.")
        parser.add_argument("--force", action="store_true", help="--drop-space even if a profile uses the space.")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
        parser.add_argument("--background", action="store_true",
                            help="Enqueue the re-embedding as a task (django_ragchat.tasks.reembed_space) on "
                                 "RAGCHAT['TASK_BACKEND'] and return; a worker runs it. With --profile only.")

    def handle(self, *args, **options):
        if options["list"]:
            return self._list()
        if options["drop_space"]:
            return self._drop(options["drop_space"], options["force"])
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1.")
        if options["analysis"]:
            return self._analysis(options)
        if options["background"]:
            return self._enqueue(options)
        embedder = self._embedder(options)
        space = embedder.space
        before = self._counts()
        self.stdout.write(f"Embedding into space {space} (now {_chunks(before.get(space, 0))}); "
                          f"other spaces keep serving: {', '.join(s for s in before if s != space) or 'none'}")
        report = reembed(embedder, batch_size=options["batch_size"], progress=self._progress(options))
        for result in report.failed:
            self.stderr.write(f"{result.source}: {result.reason}")
        self.stdout.write(f"Re-embedded {report.summary()}")
        if report.failed:
            raise CommandError(f"{len(report.failed)} document(s) failed; run the command again to retry them.")
        if connection.vendor == "postgresql" and not options["no_index"] and self._counts().get(space):
            status, created = postgres.create_hnsw_index(space)
            self.stdout.write(f"HNSW index {status.name} {'built' if created else status.state}")
        users = configured_spaces().get(space, [])
        if users:
            self.stdout.write(f"Space {space} is complete; profile(s) {', '.join(users)} use it.")
        else:
            self.stdout.write(f"Space {space} is complete. Next: point the profile(s) at this embedder in "
                              f"settings and deploy, then `manage.py ragchat_reembed --drop-space OLD_SPACE`.")

    def _analysis(self, options):
        if options["embedder"] or options["background"]:
            raise CommandError("--analysis reads the chunks of a profile's space: use --profile, in the foreground.")
        self._embedder(options)  # a wrong profile is a CommandError
        refreshed, seen = refresh_analyses(options["profile"])
        rest = "; the others were current." if refreshed < seen else "."  # "of 32 of 32 ...; the others": none
        self.stdout.write(f"Stored the answerer's reading of {refreshed:,} of {_chunks(seen)} again{rest}")

    def _enqueue(self, options):
        if options["embedder"]:
            raise CommandError("--background re-embeds into a profile's space: use --profile.")
        self._embedder(options)  # a wrong profile fails here, not in the worker
        result = tasks.enqueue(tasks.reembed_space, options["profile"], options["batch_size"], not options["no_index"])
        if tasks.runs_in_background():
            self.stdout.write(f"Enqueued re-embedding task {result.id} on task backend "
                              f"{result.backend!r}; a worker (e.g. manage.py db_worker) runs it.")
        elif result.status == tasks.TaskResultStatus.SUCCESSFUL:
            self.stdout.write(f"The task backend runs tasks on the spot; re-embedded {result.return_value['summary']}")
        else:
            raise CommandError("The re-embedding task failed: " + (result.errors[-1].traceback if result.errors else ""))

    def _embedder(self, options):
        try:
            embedder_options = json.loads(options["options"]) if options["options"] else {}
        except json.JSONDecodeError as exc:
            raise CommandError(f"--options is not valid JSON: {exc}") from None
        if not isinstance(embedder_options, dict):
            raise CommandError("--options must be a JSON object.")
        try:
            if options["embedder"]:
                registration = plugins.get_registry().get("embedder", options["embedder"])
                return registration.cls(get_profile(None), **embedder_options)
            if options["options"] is not None:
                raise CommandError("--options goes with --embedder (a profile's embedder takes the profile's options).")
            return embedder_for(get_profile(options["profile"]))
        except (ImproperlyConfigured, TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from None

    def _counts(self) -> dict[str, int]:
        return dict(Chunk.objects.order_by().values_list("space").annotate(n=Count("id")).values_list("space", "n"))

    def _progress(self, options):
        stream = getattr(self.stderr, "_out", self.stderr)
        if options["no_progress"] or not stream.isatty():
            return None
        bar = tqdm(file=stream, unit="doc", desc="Re-embedding", leave=False, dynamic_ncols=True)

        def progress(done: int, total: int, source: str) -> None:
            bar.total = total
            bar.update(done - bar.n)
            if done == total:
                bar.close()

        return progress

    def _list(self) -> None:
        users = configured_spaces()
        counts = self._counts()
        for space in sorted(set(counts) | set(users)):
            line = f"{space}: {counts.get(space, 0):,} chunks"
            if connection.vendor == "postgresql" and counts.get(space):
                status = postgres.hnsw_index_status(space)
                line += f", {status.dimensions} dimensions, HNSW index {status.state}"
            line += f"; used by {', '.join(users[space])}" if space in users else "; used by no profile"
            self.stdout.write(line)

    def _drop(self, space: str, force: bool) -> None:
        users = configured_spaces().get(space)
        if users and not force:
            raise CommandError(f"Profile(s) {', '.join(users)} still search space {space}; switch them to "
                               f"another embedder first (or pass --force).")
        deleted = 0
        while True:
            ids = list(Chunk.objects.filter(space=space).order_by("id").values_list("id", flat=True)[:DELETE_BATCH_SIZE])
            if not ids:
                break
            with transaction.atomic():
                # Not a raw delete: MessageSource rows keep their labels with chunk set to NULL.
                Chunk.objects.filter(id__in=ids).only("id").delete()
            deleted += len(ids)
        if connection.vendor == "postgresql":
            postgres.drop_hnsw_index(space)
        index = " and its HNSW index" if connection.vendor == "postgresql" else ""
        self.stdout.write(f"Deleted {_chunks(deleted)} of space {space}{index}.")


def _chunks(n: int) -> str:
    """"1 chunk", "1,204 chunks"."""
    return ngettext("%(n)s chunk", "%(n)s chunks", n) % {"n": f"{n:,}"}
