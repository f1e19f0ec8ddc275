"""``manage.py ragchat_purge``: delete conversations past their retention period.

Which conversations expire is ``models.expired_conversations()`` (``ANONYMOUS_RETENTION_DAYS``
and ``USER_RETENTION_DAYS``); ``--older-than-days N`` replaces the anonymous period for one run
(signed-in users' conversations always follow ``USER_RETENTION_DAYS``, so a typo here cannot
wipe their history). A conversation goes with its messages, sources, traces and memory records.
Documents are never purged.

First it closes the leases nobody will renew: answers still "streaming" whose lease expired
(their worker died) are marked "interrupted", keeping the text of their last heartbeat
(``persistence.close_expired_leases``; ``--leases-only`` does just that).

Deletion runs in batches of ``--batch-size`` conversations, one transaction each, so a large
purge never holds one long transaction (or the SQLite write lock) for its whole duration. Run it
from cron, e.g. daily.
"""

from __future__ import annotations

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone
from django.utils.translation import ngettext

from django_ragchat.models import Conversation, MemoryRecord, Message, expired_conversations
from django_ragchat.turn.persistence import close_expired_leases

COUNTED = (
    ("conversations", Conversation._meta.label),
    ("messages", Message._meta.label),
    ("memory records", MemoryRecord._meta.label),
)
#: How each count is said, singular and plural ("1 conversation", not "1 conversations").
WORDS = {
    "conversations": ("conversation", "conversations"),
    "messages": ("message", "messages"),
    "memory records": ("memory record", "memory records"),
}


def purgeable(older_than_days: int | None = None, now=None):
    """The conversations this run deletes (see the module docstring)."""
    now = now or timezone.now()
    expired = expired_conversations(now)
    if older_than_days is None:
        return expired
    cutoff = now - timedelta(days=older_than_days)
    return expired.filter(owner__isnull=False) | Conversation.objects.filter(owner__isnull=True, updated_at__lt=cutoff)


class Command(BaseCommand):
    help = "Delete conversations (with their messages and memory) past their retention period."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")
        parser.add_argument("--older-than-days", type=int, metavar="N",
                            help="For this run, anonymous conversations expire N days after their last "
                                 "activity (instead of ANONYMOUS_RETENTION_DAYS).")
        parser.add_argument("--batch-size", type=int, default=200, metavar="N",
                            help="Conversations deleted per transaction (default 200).")
        parser.add_argument("--leases-only", action="store_true",
                            help="Only mark answers whose worker died (expired lease) as interrupted.")

    def handle(self, *args, **options):
        days, batch_size = options["older_than_days"], options["batch_size"]
        if days is not None and days < 0:
            raise CommandError("--older-than-days must be 0 or more.")
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        now = timezone.now()
        expired = purgeable(days, now)

        if options["dry_run"]:
            stale = Message.objects.filter(status=Message.Status.STREAMING, lease_expires_at__lte=now).count()
            if stale or options["leases_only"]:
                self.stdout.write(ngettext("Would mark %(n)d answer interrupted (dry run).",
                                           "Would mark %(n)d answers interrupted (dry run).", stale) % {"n": stale})
            if options["leases_only"]:
                return
            counts = {
                "conversations": expired.count(),
                "messages": Message.objects.filter(conversation__in=expired).count(),
                "memory records": MemoryRecord.objects.filter(conversation__in=expired).count(),
            }
            self.stdout.write(f"Would delete {self._format(counts)} (dry run: nothing deleted).")
            return

        closed = close_expired_leases(now)
        if closed or options["leases_only"]:
            self.stdout.write(ngettext("Marked %(n)d answer interrupted (its worker stopped renewing it).",
                                       "Marked %(n)d answers interrupted (their worker stopped renewing them).",
                                       closed) % {"n": closed})
        if options["leases_only"]:
            return
        counts = dict.fromkeys((name for name, _ in COUNTED), 0)
        last_pk = None
        while True:
            # Walk the expired conversations by primary key; each batch is re-checked inside its
            # transaction, so a conversation that became active meanwhile is kept.
            page = expired.order_by("pk")
            if last_pk is not None:
                page = page.filter(pk__gt=last_pk)
            ids = list(page.values_list("pk", flat=True)[:batch_size])
            if not ids:
                break
            last_pk = ids[-1]
            with transaction.atomic():
                _, deleted = purgeable(days, now).filter(pk__in=ids).delete()
            for name, label in COUNTED:
                counts[name] += deleted.get(label, 0)
        self.stdout.write(f"Deleted {self._format(counts)}.")

    @staticmethod
    def _format(counts: dict[str, int]) -> str:
        return ", ".join(f"{n} {ngettext(*WORDS[name], n)}" for name, n in counts.items())
