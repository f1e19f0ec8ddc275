"""``manage.py ragchat_apikey USERNAME [--name NAME] [--expires-in DAYS]``: create an API key.

The key lets a tool call the OpenAI-compatible endpoint (docs/openai-endpoint.md) as USERNAME.
It is printed once, on the last line of the output (so ``| tail -n 1`` captures it), and never
stored: the database keeps its digest. Keys are listed, revoked and deleted in the admin.
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from django_ragchat.models import ApiKey


class Command(BaseCommand):
    help = "Create an API key for the OpenAI-compatible endpoint; the key is printed on the last line."

    def add_arguments(self, parser):
        parser.add_argument("username", help="The user the key acts as.")
        parser.add_argument("--name", default="", help="What the key is for (shown in the admin).")
        parser.add_argument("--expires-in", type=float, metavar="DAYS",
                            help="Days until the key expires (default: never).")

    def handle(self, *args, username, name, expires_in, **options):
        User = get_user_model()
        try:
            user = User.objects.get(**{User.USERNAME_FIELD: username})
        except User.DoesNotExist:
            raise CommandError(f"There is no user {username!r}.") from None
        if not user.is_active:
            raise CommandError(f"The user {username!r} is inactive: a key of theirs would be refused.")
        if len(name) > ApiKey._meta.get_field("name").max_length:
            raise CommandError("--name is limited to 100 characters.")
        if expires_in is not None and expires_in <= 0:
            raise CommandError("--expires-in must be a positive number of days.")
        expires_at = timezone.now() + timedelta(days=expires_in) if expires_in is not None else None
        api_key, key = ApiKey.create_key(user, name, expires_at=expires_at)
        expiry = f", expires {expires_at:%Y-%m-%d %H:%M} UTC" if expires_at else ""
        self.stdout.write(f"Created the API key {api_key} for {username}{expiry}. It is shown only now "
                          "(the database keeps its digest); store it where the tool reads it:")
        self.stdout.write(key)
