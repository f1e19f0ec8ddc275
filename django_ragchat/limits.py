"""Per-user limits on turns, enforced before anything is saved.

* ``TURNS_PER_MINUTE``: a fixed one-minute window counted in Django's cache (shared by every
  worker when the cache is, e.g. Redis or Memcached; per process with the local-memory cache).
* ``MAX_CONCURRENT_STREAMS``: answers being written at once for one user.

A refusal raises ``LimitExceeded`` with a ``retry_after`` in seconds: HTTP transports answer
429 with ``Retry-After``, the websocket an ``error`` event with code ``rate_limited``.
"""

from __future__ import annotations

import contextlib
import time

from django.core.cache import cache

from django_ragchat.conf import ragchat_settings


class LimitExceeded(Exception):
    def __init__(self, code: str, message: str, retry_after: float):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after


def _subject(user, session_key: str | None) -> str:
    if user is not None and user.is_authenticated:
        return f"u{user.pk}"
    return f"s{session_key or 'none'}"


def check_turn_rate(user, session_key: str | None = None) -> None:
    """Count one turn for this user; raise ``LimitExceeded`` past ``TURNS_PER_MINUTE``."""
    limit = ragchat_settings.TURNS_PER_MINUTE
    if not limit:
        return
    window = int(time.time() // 60)
    key = f"ragchat:rate:{_subject(user, session_key)}:{window}"
    cache.add(key, 0, timeout=120)
    try:
        count = cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=120)
        count = 1
    if count > limit:
        raise LimitExceeded("rate_limited", f"Too many messages: at most {limit} a minute.",
                            retry_after=60 - time.time() % 60)


@contextlib.contextmanager
def stream_slot(user, session_key: str | None = None):
    """Hold one of the user's ``MAX_CONCURRENT_STREAMS`` slots for the duration of a turn."""
    limit = ragchat_settings.MAX_CONCURRENT_STREAMS
    key = f"ragchat:streams:{_subject(user, session_key)}"
    if not limit:
        yield
        return
    cache.add(key, 0, timeout=3600)
    count = cache.incr(key)
    try:
        if count > limit:
            raise LimitExceeded("too_many_streams",
                                f"At most {limit} answers can be written at once; wait for one to finish.",
                                retry_after=5)
        yield
    finally:
        try:
            cache.decr(key)
        except ValueError:
            pass
