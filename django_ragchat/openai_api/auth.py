"""Who is calling: an API key (``Authorization: Bearer <key>``) or the Django session.

A key acts as its user (``ApiKey``): that user's conversations, profiles and limits. Without an
``Authorization`` header the session's user is the caller, as on the chat page; a request that
changes something (``POST``) then needs the CSRF token, as every session-authenticated write of
the site does (``X-CSRFToken``), while a key needs none (a browser never sends it on its own).
Only signed-in users: anonymous visitors have no key, and their session-bound conversations are
the chat page's.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from django.utils import timezone

from django_ragchat.models import ApiKey
from django_ragchat.openai_api.errors import OpenAIError
from django_ragchat.transport import csrf

NO_CREDENTIALS = ("Send an API key as 'Authorization: Bearer <key>' (staff create keys in the admin, or with "
                  "'manage.py ragchat_apikey USERNAME'), or sign in.")


class Caller(NamedTuple):
    """The user a request acts as, and the key it used (``None``: the session)."""

    user: Any
    api_key: ApiKey | None


def invalid_key(message: str = "Incorrect API key provided.") -> OpenAIError:
    return OpenAIError(401, "invalid_api_key", message)


def caller_for_key(key: str) -> Caller:
    """The caller ``key`` authenticates (its use recorded), or ``OpenAIError`` 401
    ``invalid_api_key``: unknown, revoked or expired keys, and keys of inactive users. One
    query, and one more at most once a minute per key (``last_used_at``)."""
    api_key = ApiKey.objects.select_related("user").filter(digest=ApiKey.digest_of(key)).first()
    if api_key is None or not api_key.user.is_active:
        raise invalid_key()
    now = timezone.now()
    if api_key.revoked_at is not None:
        raise invalid_key("This API key has been revoked.")
    if api_key.expires_at is not None and api_key.expires_at <= now:
        raise invalid_key("This API key has expired.")
    api_key.touch(now)
    return Caller(api_key.user, api_key)


async def session_user(request):
    """The session's user when the request sends no ``Authorization`` header (``None`` when it
    does: the key is checked by ``caller_of``, with the rest of the request's work)."""
    return None if "Authorization" in request.headers else await request.auser()


def caller_of(request, user=None) -> Caller:
    """The caller: the key's (``Authorization: Bearer``), or the session's ``user`` (from
    ``session_user``). ``OpenAIError``: 401 without credentials or with a bad key, 403 for a
    session-authenticated write without the CSRF token. Synchronous (database)."""
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, key = header.strip().partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise invalid_key("Send the API key as 'Authorization: Bearer <key>'.")
        return caller_for_key(key)
    if user is None or not user.is_authenticated:
        raise OpenAIError(401, "not_authenticated", NO_CREDENTIALS)
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        reason = csrf.failure(request)
        if reason is not None:
            raise OpenAIError(403, csrf.CODE, csrf.message(reason, "; tools should use an API key instead"))
    return Caller(user, None)


async def authenticate(request) -> Caller:
    """``caller_of`` for async views."""
    user = await session_user(request)
    return await sync_to_async(caller_of)(request, user)
