"""Who may read what the assistant searches: principal tokens on rows, principals of readers.

Every ``Document`` and every ``Chunk`` stores ``access``, the list of principal tokens it was
indexed with; a reader whose principals share one token with it may read it. The tokens:

====================================  ==========================================================
``"public"`` (``PUBLIC``)             everyone, anonymous visitors included: the default
``"authenticated"`` (``AUTHENTICATED``)  every signed-in, active user
``"staff"`` (``STAFF``)               users with ``is_staff``
``"user:<pk>"``                       one user
``"group:<pk>"``                      the members of one group
``"perm:<app_label>.<codename>"``     users holding that permission, through any authentication
                                      backend (``user.get_all_permissions()``; superusers hold
                                      every permission)
====================================  ==========================================================

A reader's principals (``principals_for``): ``"public"`` always; a signed-in, active user adds
``"authenticated"``, ``"user:<pk>"``, one ``"group:<pk>"`` per group, one ``"perm:..."`` per
permission and ``"staff"`` when staff. They are read from the database when asked for, so a
change of a user's groups or permissions applies to their next turn.

The search layer (``django_ragchat.search``) filters by principals inside its SQL on every
database, so nothing built on it (retrievers, plugins, query expansion) can return a row its
reader may not read. A search not told whose it is reads as the turn in progress
(``reading_as``) or, outside any turn, as an anonymous visitor: ``PUBLIC`` rows only.
``UNRESTRICTED`` (everything) is for trusted code that says so: management commands, the admin.
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections, router

PUBLIC = "public"
AUTHENTICATED = "authenticated"
STAFF = "staff"
#: Tokens that name no row: what ``access_tokens`` accepts as is.
WORD_TOKENS = (PUBLIC, AUTHENTICATED, STAFF)

_TOKEN = re.compile(r"^(?:public|authenticated|staff|user:[\w\-.@+]{1,64}|group:[\w\-.@+]{1,64}"
                    r"|perm:[\w\-]{1,100}\.[\w\-.]{1,100})$")
_PERMISSION = re.compile(r"^[\w\-]{1,100}\.[\w\-.]{1,100}$")


class InvalidAccess(ValueError):
    """An access value that names no principal django-ragchat knows (the message says which)."""


def public_access() -> list[str]:
    """The default ``access`` of a document or chunk: everyone may read it."""
    return [PUBLIC]


def _label(value: Any) -> str | None:
    meta = getattr(value, "_meta", None)
    return getattr(meta, "label_lower", None) if meta is not None else None


def _one_token(value: Any) -> str:
    if isinstance(value, str):
        if _TOKEN.match(value):
            return value
        if _PERMISSION.match(value):
            return f"perm:{value}"
        raise InvalidAccess(f"{value!r} is not an access token: use PUBLIC, AUTHENTICATED, STAFF, a user, a group, "
                            f"'app_label.codename' (a permission) or 'user:<pk>' / 'group:<pk>'.")
    label = _label(value)
    if label is not None and getattr(value, "pk", None) is not None:
        if label == settings.AUTH_USER_MODEL.lower():
            return f"user:{value.pk}"
        if label == "auth.group":
            return f"group:{value.pk}"
        if label == "auth.permission":
            return f"perm:{value.content_type.app_label}.{value.codename}"
    raise InvalidAccess(f"{value!r} is not a user, a group, a permission or an access token.")


def access_tokens(value: Any) -> tuple[str, ...]:
    """The sorted, distinct tokens of an access value: ``PUBLIC``, a user, a group, a permission
    (``"app_label.codename"`` or a ``Permission``), a token string, or any iterable of those
    (a queryset of users included). ``None`` or an empty iterable: nobody. Raises
    ``InvalidAccess`` for anything else (an unsaved user, an anonymous user, a misspelt token)."""
    if value is None:
        return ()
    if isinstance(value, str) or _label(value) is not None:
        return (_one_token(value),)
    if isinstance(value, Iterable):
        return tuple(sorted({_one_token(item) for item in value}))
    raise InvalidAccess(f"{value!r} is not an access value.")


@dataclass(frozen=True)
class Principals:
    """The principal tokens of one reader; ``tokens=None`` reads everything (``UNRESTRICTED``)."""

    tokens: frozenset[str] | None

    @property
    def unrestricted(self) -> bool:
        return self.tokens is None

    def may_read(self, access: Iterable[str]) -> bool:
        """Whether a row stored with ``access`` is readable by these principals."""
        return self.tokens is None or not self.tokens.isdisjoint(access)

    def covers(self, other: Principals) -> bool:
        """Whether everything ``other`` may read, these principals may read too."""
        if self.tokens is None:
            return True
        return other.tokens is not None and other.tokens <= self.tokens

    def sorted(self) -> list[str]:
        return sorted(self.tokens or ())

    def __repr__(self) -> str:
        return "Principals(UNRESTRICTED)" if self.tokens is None else f"Principals({self.sorted()})"


PUBLIC_ONLY = Principals(frozenset({PUBLIC}))
UNRESTRICTED = Principals(None)


def principals_for(user: Any, *, refresh: bool = False) -> Principals:
    """The principals of ``user`` (``None`` or an anonymous user: ``PUBLIC_ONLY``).

    ``refresh`` reads the user again first (a websocket's user object lives as long as its
    connection; a turn asks with ``refresh``). Four queries for a signed-in user with Django's
    own backend (the user, the groups, the user's and the groups' permissions), none for an
    anonymous one.
    """
    if user is None or not getattr(user, "is_authenticated", False):
        return PUBLIC_ONLY
    if refresh:
        user = type(user)._default_manager.filter(pk=user.pk).first()
        if user is None:
            return PUBLIC_ONLY
    if not getattr(user, "is_active", True):
        return PUBLIC_ONLY
    tokens = {PUBLIC, AUTHENTICATED, f"user:{user.pk}"}
    if getattr(user, "is_staff", False):
        tokens.add(STAFF)
    if hasattr(user, "groups"):
        tokens.update(f"group:{pk}" for pk in user.groups.values_list("pk", flat=True))
    if hasattr(user, "get_all_permissions"):
        tokens.update(f"perm:{name}" for name in user.get_all_permissions())
    return Principals(frozenset(tokens))


MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


def _model_backend_only(user_model) -> bool:
    """Whether permissions come from Django's ``ModelBackend`` alone, on a user model with its
    usual fields: then one query reads a user's principals (``principals_of_user_id``)."""
    names = {f.name for f in user_model._meta.get_fields()}
    return (list(settings.AUTHENTICATION_BACKENDS) == [MODEL_BACKEND]
            and {"is_active", "is_staff", "is_superuser", "groups", "user_permissions"} <= names)


def principals_of_user_id(user_id: Any) -> Principals:
    """The principals of the user with primary key ``user_id``, read now (``None``, or a user
    that no longer exists: ``PUBLIC_ONLY``).

    With Django's ``ModelBackend`` alone (the default), one query (``_principals_sql``): the
    user's flags, their groups, and the permissions ``ModelBackend`` would grant (the user's
    and their groups', or all of them for a superuser). Otherwise the user is loaded and every
    backend asked (``principals_for``)."""
    if user_id is None:
        return PUBLIC_ONLY
    user_model = get_user_model()
    if not _model_backend_only(user_model):
        return principals_for(user_model._default_manager.filter(pk=user_id).first())
    using = router.db_for_read(user_model)
    connection = connections[using]
    pk = user_model._meta.pk.to_python(user_id)
    with connection.cursor() as cursor:
        cursor.execute(_principals_sql(using, user_model), [user_model._meta.pk.get_db_prep_value(pk, connection)] * 5)
        rows = cursor.fetchall()
    flags = next((n for kind, n, *_ in rows if kind == 0), None)
    if flags is None or not flags & 1:  # no such user, or inactive
        return PUBLIC_ONLY
    tokens = {PUBLIC, AUTHENTICATED, f"user:{pk}"}
    tokens.update(f"group:{n}" for kind, n, *_ in rows if kind == 1)
    tokens.update(f"perm:{app}.{codename}" for kind, _, app, codename in rows if kind == 2)
    if flags & 2:
        tokens.add(STAFF)
    return Principals(frozenset(tokens))


@functools.cache
def _principals_sql(using: str, user_model) -> str:
    """One statement for ``principals_of_user_id`` (its five parameters: the user's pk), rows of
    (kind, number, app label, codename): (0, flags) for the user (1 active, 2 staff, 4
    superuser), (1, group pk) per group, (2, 0, app label, codename) per permission. Written
    once per database and user model from their tables' names: built by the ORM, the two
    queries it replaces cost more to build than to run."""
    qn = connections[using].ops.quote_name
    user = user_model._meta
    groups, own = user.get_field("groups"), user.get_field("user_permissions")
    permission = own.related_model._meta
    by_group = groups.related_model._meta.get_field("permissions")
    content_type = permission.get_field("content_type")
    member = groups.remote_field.through._meta
    member_user, member_group = (qn(member.get_field(name).column)
                                 for name in (groups.m2m_field_name(), groups.m2m_reverse_field_name()))
    granted, held = own.remote_field.through._meta, by_group.remote_field.through._meta
    column = {name: qn(user.get_field(name).column) for name in ("is_active", "is_staff", "is_superuser")}
    return (
        f"SELECT 0, CASE WHEN u.{column['is_active']} THEN 1 ELSE 0 END + CASE WHEN u.{column['is_staff']} THEN 2 "
        f"ELSE 0 END + CASE WHEN u.{column['is_superuser']} THEN 4 ELSE 0 END, NULL, NULL "
        f"FROM {qn(user.db_table)} u WHERE u.{qn(user.pk.column)} = %s "
        f"UNION ALL SELECT 1, m.{member_group}, NULL, NULL FROM {qn(member.db_table)} m WHERE m.{member_user} = %s "
        f"UNION ALL SELECT 2, 0, t.{qn(content_type.related_model._meta.get_field('app_label').column)}, "
        f"p.{qn(permission.get_field('codename').column)} FROM {qn(permission.db_table)} p "
        f"INNER JOIN {qn(content_type.related_model._meta.db_table)} t "
        f"ON p.{qn(content_type.column)} = t.{qn(content_type.related_model._meta.pk.column)} "
        f"WHERE EXISTS (SELECT 1 FROM {qn(user.db_table)} s WHERE s.{qn(user.pk.column)} = %s "
        f"AND s.{column['is_superuser']}) "
        f"OR p.{qn(permission.pk.column)} IN (SELECT g.{qn(granted.get_field(own.m2m_reverse_field_name()).column)} "
        f"FROM {qn(granted.db_table)} g WHERE g.{qn(granted.get_field(own.m2m_field_name()).column)} = %s) "
        f"OR p.{qn(permission.pk.column)} IN (SELECT h.{qn(held.get_field(by_group.m2m_reverse_field_name()).column)} "
        f"FROM {qn(held.db_table)} h INNER JOIN {qn(member.db_table)} m "
        f"ON h.{qn(held.get_field(by_group.m2m_field_name()).column)} = m.{member_group} WHERE m.{member_user} = %s)"
    )


def access_sql(vendor: str, column: str, principals: Principals) -> tuple[str, list]:
    """A condition that the JSON list in ``column`` shares a token with ``principals``, and its
    parameters; ``("", [])`` for ``UNRESTRICTED``. PostgreSQL: ``jsonb ?| text[]`` (the GIN
    index of migration 0005 serves it). Elsewhere: SQLite's ``json_each``, the tokens passed as
    one JSON parameter whatever their number (a superuser holds every permission)."""
    if principals.tokens is None:
        return "", []
    tokens = principals.sorted()
    if vendor == "postgresql":
        return f"{column} ?| %s::text[]", [tokens]
    return (f"EXISTS (SELECT 1 FROM json_each({column}) ra WHERE ra.value IN "
            f"(SELECT rp.value FROM json_each(%s) rp))", [json.dumps(tokens)])


def users_only(principals: Principals) -> Principals:
    """``principals`` narrowed to their user token(s): what was shared with the reader by name
    (their orders, bookings), not what everyone, a group or a permission reads. Never wider;
    ``UNRESTRICTED`` and the anonymous read nothing so."""
    return Principals(frozenset(t for t in principals.tokens or () if t.startswith("user:")))


def only_for(access: Iterable[str], principals: Principals | None) -> bool:
    """Whether a row of ``access`` is the reader's own: only users may read it, each of them one
    that ``principals`` is ("user:<pk>"): a customer's order, not a page or a group's notes."""
    tokens = list(access)
    return bool(tokens) and principals is not None and principals.tokens is not None and all(
        t.startswith("user:") and t in principals.tokens for t in tokens)


# --- Whose search this is ----------------------------------------------------------------------

_reader: contextvars.ContextVar[Principals | None] = contextvars.ContextVar("ragchat_reader", default=None)


def current_principals() -> Principals:
    """The principals searches read as here: the turn's (``reading_as``), else ``PUBLIC_ONLY``."""
    return _reader.get() or PUBLIC_ONLY


class reading_as:  # lower case: used like a function, ``with reading_as(principals):``
    """Searches inside this block (and the tasks and threads it starts through asyncio or
    asgiref, which copy the context) read as ``principals`` unless told otherwise. A class, not
    a generator's context manager: every stage of a turn enters it (``pipeline.searching_for``)."""

    __slots__ = ("principals", "token")

    def __init__(self, principals: Principals):
        self.principals = principals

    def __enter__(self) -> None:
        self.token = _reader.set(self.principals)

    def __exit__(self, *exc_info: Any) -> None:
        _reader.reset(self.token)
