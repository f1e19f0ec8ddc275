"""Settings for django-ragchat, read from one ``RAGCHAT = {...}`` dict in the site's settings.

Access them through ``ragchat_settings`` (the way DRF's ``api_settings`` works)::

    from django_ragchat.conf import ragchat_settings
    ragchat_settings.MAX_MESSAGE_CHARS

Every key has a documented default below; unknown keys are reported by the system check
``ragchat.E001`` rather than ignored. ``KINDS`` says what each key takes (a whole number 0 or
more, True or False...): ``ragchat_settings.problems()`` lists every value its kind refuses,
which the system check reports as ``ragchat.E007``. Values are read as the site wrote them, but
for the flags (``FLAG``): anything but ``True`` reads as ``False`` (and is logged), so that a
wrong value (``"no"``) never turns a feature on on a server, which runs no system check. The
object is reloaded when tests change ``RAGCHAT`` through ``override_settings``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
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

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kind:
    """What a setting takes: ``takes`` says it in words, ``accepts`` tells a value it takes."""

    takes: str
    accepts: Callable[[Any], bool]


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int to Python, not to a site


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _text(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def one_of(*choices: Any) -> Kind:
    """A kind that takes one of ``choices``, compared with their type: 1 is not True."""
    return Kind(f"one of {', '.join(map(repr, choices))}",
                lambda value: any(type(value) is type(choice) and value == choice for choice in choices))


FLAG = Kind("True or False", lambda value: isinstance(value, bool))
COUNT = Kind("a whole number, 0 or more", lambda value: _whole(value) and value >= 0)
POSITIVE = Kind("a whole number, 1 or more", lambda value: _whole(value) and value >= 1)
SECONDS = Kind("a number of seconds above 0", lambda value: _number(value) and value > 0)
DAYS = Kind("a number of days, 0 or more, or None (kept forever)",
            lambda value: value is None or (_number(value) and value >= 0))
NAME = Kind("a non-empty string", _text)
DOTTED_PATH = Kind("the dotted path of a callable, a string", _text)
DOTTED_PATHS = Kind("a list of dotted paths (strings)",
                    lambda value: isinstance(value, (list, tuple)) and all(map(_text, value)))

#: What each key of ``DEFAULTS`` takes; ``PROFILES``, a dict of dicts, is checked by
#: ``django_ragchat.profiles`` (``ragchat.E002``).
KINDS: dict[str, Kind] = {
    "DEFAULT_PROFILE": NAME,
    "PLUGINS": DOTTED_PATHS,
    "LOAD_ENTRY_POINTS": FLAG,
    "MAX_MESSAGE_CHARS": POSITIVE,
    "TURNS_PER_MINUTE": COUNT,
    "MAX_CONCURRENT_STREAMS": COUNT,
    "ANONYMOUS_RETENTION_DAYS": DAYS,
    "USER_RETENTION_DAYS": DAYS,
    "ALLOW_ANONYMOUS": FLAG,
    "CITED_SOURCES_ONLY": one_of(True, False, "signed_out"),
    "STREAM_HEARTBEAT_SECONDS": SECONDS,
    "STREAM_LEASE_SECONDS": SECONDS,
    "SHUTDOWN_GRACE_SECONDS": SECONDS,
    "SQLITE_VECTOR_BATCH_SIZE": POSITIVE,
    "CONVERSATION_PERMISSION": DOTTED_PATH,
    "CONVERSATION_CHANGE_PERMISSION": DOTTED_PATH,
    "DOCUMENT_PERMISSION": DOTTED_PATH,
    "PROFILE_PERMISSION": DOTTED_PATH,
    "OPENAI_API_SYSTEM_MESSAGES": one_of("ignore", "refuse"),
    "TASK_BACKEND": NAME,
    "BACKGROUND_INGEST_BYTES": COUNT,
    "DATABASE_THREADS": POSITIVE,
    "STARTING_TURNS": COUNT,
}


@dataclass(frozen=True)
class SettingProblem:
    """A setting whose value its kind refuses: what the system check (``ragchat.E007``) and
    the log say."""

    name: str
    value: Any
    takes: str

    def __str__(self) -> str:
        return f"RAGCHAT[{self.name!r}] must be {self.takes}, not {self.value!r}"


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
        value = self.given(attr)
        if KINDS.get(attr) is FLAG and not FLAG.accepts(value):
            # Fail closed: "no" is a truthy string, and turned anonymous chat on.
            logger.error("%s: read as False (manage.py check reports it, ragchat.E007).",
                         SettingProblem(attr, value, FLAG.takes))
            value = False
        self._cached.add(attr)
        setattr(self, attr, value)
        return value

    def given(self, name: str) -> Any:
        """``name``'s value as the site wrote it (its default when it wrote none), unchecked."""
        return self.user_settings.get(name, self.defaults[name])

    def problems(self, names: Iterable[str] | None = None) -> list[SettingProblem]:
        """The settings among ``names`` (every one with a kind when ``None``) whose value their
        kind (``KINDS``) refuses, in ``KINDS``' order."""
        wanted = KINDS if names is None else set(names)
        return [SettingProblem(name, self.given(name), kind.takes) for name, kind in KINDS.items()
                if name in wanted and not kind.accepts(self.given(name))]

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
