"""``manage.py ragchat_admin_group``: create (or update) the group staff need to work in the chat admin.

Being staff opens the admin; what a staff member may do there is Django's model permissions.
The group this command makes ("Chat reviewers" by default) can read every django-ragchat
model (conversations and their transcripts and traces, messages, sources, tool calls, feedback,
documents, chunks and the state of model sources) and add, change and delete memory records, which
is how staff correct what the model remembers about other users. ``--documents`` adds uploading,
re-ingesting and deleting documents and resyncing model sources; ``--erase`` adds exporting and
erasing a user's chat data (delete permissions on
the chat's models). Run it again after upgrading: it only adds what is missing and removes
nothing. Then add staff to the group (``user.groups.add(...)``, or the user admin page).
"""

from __future__ import annotations

from django.apps import apps
from django.contrib.auth.management import create_permissions
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand

MODELS = ("conversation", "message", "messagesource", "toolinvocation", "turntrace", "feedback", "memoryrecord",
          "document", "chunk", "sourcestate")


def permission_codenames(*, documents: bool = False, erase: bool = False) -> set[str]:
    """The ``django_ragchat`` permission codenames of the reviewers' group."""
    codenames = {f"view_{model}" for model in MODELS}
    codenames |= {"add_memoryrecord", "change_memoryrecord", "delete_memoryrecord"}
    if documents:
        codenames |= {"add_document", "delete_document", "delete_chunk", "change_sourcestate"}
    if erase:
        codenames |= {f"delete_{m}" for m in ("conversation", "message", "messagesource", "toolinvocation", "turntrace",
                                              "feedback")}
    return codenames


class Command(BaseCommand):
    help = "Create or update the group of staff who read conversations and correct memory in the admin."

    def add_arguments(self, parser):
        parser.add_argument("--name", default="Chat reviewers", help='The group\'s name (default "Chat reviewers").')
        parser.add_argument("--documents", action="store_true", help="Also upload, re-ingest and delete documents.")
        parser.add_argument("--erase", action="store_true", help="Also export and erase a user's chat data.")

    def handle(self, *args, name, documents, erase, **options):
        # Permissions are created after migrate; make sure they exist on a fresh database.
        create_permissions(apps.get_app_config("django_ragchat"), verbosity=0)
        codenames = permission_codenames(documents=documents, erase=erase)
        permissions = Permission.objects.filter(content_type__app_label="django_ragchat", codename__in=codenames)
        group, created = Group.objects.get_or_create(name=name)
        group.permissions.add(*permissions)
        self.stdout.write(f"{'Created' if created else 'Updated'} the group {name!r}: "
                          f"{len(codenames)} permissions ({', '.join(sorted(codenames))}).")
