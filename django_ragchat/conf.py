"""Settings for django-ragchat, read from one ``RAGCHAT = {...}`` dict in the site's settings.

Access them through ``ragchat_settings`` (the way DRF's ``api_settings`` works)::

    from django_ragchat.conf import ragchat_settings
    ragchat_settings.MAX_MESSAGE_CHARS

Every key has a documented default below; unknown keys are reported by the system check
``ragchat.E001`` rather than ignored. The object is reloaded when tests change ``RAGCHAT``
through ``override_settings``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    # Named assistant profiles: {"name": {profile options}}; see django_ragchat.profiles.
    # Missing options take the defaults in profiles.PROFILE_DEFAULTS.
    "PROFILES": {"default": {}},
    # The profile a new conversation uses when none is named.
    "DEFAULT_PROFILE": "default",
    # Extra plugins: dotted paths of modules (or objects) carrying @hookimpl functions.
    "PLUGINS": [],
    # Load plugins installed through the "django_ragchat" setuptools entry point group.
    "LOAD_ENTRY_POINTS": True,
    # Input limits, enforced before anything is saved.
    "MAX_MESSAGE_CHARS": 16_000,
    # Turns a user (or anonymous session) may start in any 60 s (a sliding window); 0 disables.
    "TURNS_PER_MINUTE": 30,
    # Answers being written at once for one user; 0 disables the limit.
    "MAX_CONCURRENT_STREAMS": 3,
    # Anonymous conversations (no owner) are deleted by ragchat_purge this many days after
    # their last activity. None keeps them forever.
    "ANONYMOUS_RETENTION_DAYS": 30,
    # Conversations of signed-in users are kept forever unless this is set.
    "USER_RETENTION_DAYS": None,
    # Allow conversations without a signed-in user, bound to the session key.
    "ALLOW_ANONYMOUS": False,
    # The chat widget shows only the passages an answer cites (not every passage it was built
    # from): True for everyone, False for nobody, "signed_out" for visitors who are not signed in.
    "CITED_SOURCES_ONLY": "signed_out",
    # An answer being written is a lease, not a lock: its worker renews it every
    # STREAM_HEARTBEAT_SECONDS (saving the partial text), and an answer whose lease is
    # STREAM_LEASE_SECONDS past its last renewal belongs to a dead worker: it is marked
    # "interrupted" and no longer blocks its conversation. Per-user stream slots expire the same
    # way. See docs/architecture.md, "Crash safety".
    "STREAM_HEARTBEAT_SECONDS": 5,
    "STREAM_LEASE_SECONDS": 30,
    # On SIGTERM, how long the answers being written get to save their partial text
    # (as "incomplete") and tell their clients before the server's own shutdown goes on.
    "SHUTDOWN_GRACE_SECONDS": 5,
    # Vector search on databases without pgvector: rows loaded per batch when building the
    # in-process matrix.
    "SQLITE_VECTOR_BATCH_SIZE": 5000,
    # Who may see and change a conversation: dotted path of a callable(user, conversation) -> bool.
    "CONVERSATION_PERMISSION": "django_ragchat.permissions.is_owner_or_reviewer",
    # Who may change (send to, rename, delete) a conversation they can see; same signature.
    "CONVERSATION_CHANGE_PERMISSION": "django_ragchat.permissions.is_owner",
    # Who may add and delete documents through the API: dotted path of a callable(user) -> bool;
    # by default staff with the admin's add_document and delete_document ("...is_staff": all staff).
    "DOCUMENT_PERMISSION": "django_ragchat.permissions.may_manage_documents",
    # Which profiles a user may start conversations with: dotted path of a
    # callable(user, profile_name) -> bool. The default profile is always allowed.
    "PROFILE_PERMISSION": "django_ragchat.permissions.any_profile",
    # The OpenAI-compatible endpoint (django_ragchat.openai_api): what to do with a request's own
    # "system" (or "developer") messages. The site's system prompt is the profile's; "ignore"
    # leaves them out (the trace says so), "refuse" answers 400 system_message_not_allowed.
    "OPENAI_API_SYSTEM_MESSAGES": "ignore",
    # The alias in the site's TASKS setting that background work is enqueued on (summary folds,
    # uploads, re-embedding; see django_ragchat.tasks and docs/tasks.md).
    "TASK_BACKEND": "default",
    # Uploads larger than this are ingested by a task (202 with its id) when the task backend
    # runs tasks elsewhere; smaller ones, or every one on the immediate backend, answer at once.
    "BACKGROUND_INGEST_BYTES": 256 * 1024,
    # Threads a worker process spreads its websocket turns' database work over (one turn stays
    # on one thread); 1 runs it all on asgiref's single thread. See django_ragchat.turn.lanes.
    "DATABASE_THREADS": 4,
    # Turns of a worker process that do their work before the model at once; the others wait
    # in arrival order (django_ragchat.turn.start_gate). 0: no limit.
    "STARTING_TURNS": 8,
}


class RagchatSettings:
    """Attribute access to the ``RAGCHAT`` dict with defaults.

    Values are cached on first access; ``reload()`` (called on ``setting_changed``) clears them.
    """

    def __init__(self, defaults: dict[str, Any] | None = None):
        self.defaults = defaults or DEFAULTS
        self._cached: set[str] = set()

    @property
    def user_settings(self) -> dict[str, Any]:
        if not hasattr(self, "_user_settings"):
            self._user_settings = getattr(settings, "RAGCHAT", {}) or {}
        return self._user_settings

    def __getattr__(self, attr: str) -> Any:
        if attr not in self.defaults:
            raise AttributeError(f"Invalid django-ragchat setting: {attr!r}")
        value = self.user_settings.get(attr, self.defaults[attr])
        self._cached.add(attr)
        setattr(self, attr, value)
        return value

    def unknown_keys(self) -> list[str]:
        """Keys in the site's ``RAGCHAT`` dict that django-ragchat does not know (likely typos)."""
        return sorted(set(self.user_settings) - set(self.defaults))

    def reload(self) -> None:
        for attr in self._cached:
            delattr(self, attr)
        self._cached.clear()
        if hasattr(self, "_user_settings"):
            delattr(self, "_user_settings")


ragchat_settings = RagchatSettings(DEFAULTS)


@receiver(setting_changed)
def _reload_settings(*, setting: str, **kwargs: Any) -> None:
    if setting == "RAGCHAT":
        ragchat_settings.reload()
        # The plugin manager and the components built from profiles are dropped by the
        # receiver in django_ragchat.plugins (connected after this one, so it runs after it).
