"""``manage.py ragchat_sync [NAME ...] [--since 2h]``: index the site's model sources now.

See docs/sources.md and docs/commands.md. With no name, every registered source (system check
``ragchat.I050`` lists them). Idempotent: objects whose text, title, metadata and access are
unchanged are not embedded again, an access change alone is stored in place, and what left a
source's queryset (deleted, unpublished, readable by nobody) is removed. ``--since`` looks only
at objects whose ``updated_field`` changed since then (a duration: 90s, 30m, 2h, 1d, 1w; or an
ISO date or date-time) and still removes what left the queryset: run it from cron after bulk
``update()``s, which send no signals. One summary line per source, then the totals; failures on
stderr, one per line ("source:pk: reason"). The exit status is non-zero when a source failed for
every object it looked at.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from django_ragchat.management.commands.ragchat_ingest import build_missing_indexes
from django_ragchat.management.progress import progress_bar
from django_ragchat.sources import parse_since, sources, sync
from django_ragchat.sources.sync import OUTCOMES


class Command(BaseCommand):
    help = "Index the site's model sources (all, or those named): new, changed and removed objects."

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="*", metavar="NAME", help="Sources to sync (default: every one).")
        parser.add_argument("--since", metavar="WHEN",
                            help="Only objects changed since: a duration (90s, 30m, 2h, 1d, 1w) or an ISO date or "
                                 "date-time; needs the source's updated_field (others are synced whole).")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar.")

    def handle(self, *args, **options):
        registered = sources()
        unknown = [name for name in options["names"] if name not in registered]
        if unknown:
            raise CommandError(f"No model source named {', '.join(unknown)}; registered: "
                               f"{', '.join(registered) or 'none (see docs/sources.md)'}.")
        since = None
        if options["since"]:
            try:
                since = parse_since(options["since"])
            except ValueError as exc:
                raise CommandError(f"--since: {exc}") from None
        chosen = [registered[name] for name in options["names"]] or list(registered.values())
        if not chosen:
            self.stdout.write("No model sources are registered (docs/sources.md says how).")
            return
        totals = dict.fromkeys(OUTCOMES, 0)
        hopeless = []
        for source in chosen:
            if since is not None and not source.updated_field:
                self.stdout.write(f"{source.name} has no updated_field: every object is looked at.")
            with progress_bar(self, off=options["no_progress"], unit="obj", desc="Syncing") as progress:
                report = sync(source, since=since, progress=progress)
            for pk, reason in report.failures:
                self.stderr.write(f"{source.name}:{pk}: {reason}")
            self.stdout.write(report.summary())
            for name, n in report.counts.items():
                totals[name] += n
            if report.objects and report.counts["failed"] >= report.objects:
                hopeless.append(source.name)
        build_missing_indexes(self.stdout)
        counts = ", ".join(f"{n} {'access only' if name == 'access' else name}" for name, n in totals.items())
        # A trial read "0 created ... 5 unchanged" right after creating 5 objects as a failure:
        # live sync had indexed them. Say so when nothing was left to do.
        if totals["unchanged"] and not any(n for name, n in totals.items() if name != "unchanged"):
            counts += "; every object was indexed as it is already (saves and deletes are synced live)"
        self.stdout.write(f"Synced {len(chosen)} source(s): {counts}")  # the last line: the totals
        if hopeless:
            raise CommandError(f"Every object failed in: {', '.join(hopeless)}.")
