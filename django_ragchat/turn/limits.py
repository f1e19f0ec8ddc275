"""Per-user limits on turns, enforced before anything is saved.

* ``TURNS_PER_MINUTE``: a fixed one-minute window counted in Django's cache (shared by every
  worker when the cache is, e.g. Redis or Memcached; per process with the local-memory cache).
* ``MAX_CONCURRENT_STREAMS``: answers being written at once for one user. Each answer holds a
  *slot*: one of ``MAX_CONCURRENT_STREAMS`` cache keys, taken with ``cache.add`` and expiring
  after ``STREAM_LEASE_SECONDS`` unless renewed. The turn's heartbeat renews the slots its task
  holds (``renew_held_slots``), so a slot follows its holder: released when the turn ends, and
  by expiry within one lease when the worker holding it was killed. No counter can leak.

A refusal raises ``LimitExceeded`` with a ``retry_after`` in seconds: HTTP transports answer
429 with ``Retry-After``, the websocket an ``error`` event with code ``rate_limited`` or
``too_many_streams``. For the rate that is the start of the next minute; for the slots, when
the first held slot's lease runs out unless renewed (a turn that ends frees its slot sooner).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import secrets
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


# The slots held by the current task (a turn's); its heartbeat renews them.
_held: contextvars.ContextVar[tuple[StreamSlot, ...]] = contextvars.ContextVar("ragchat_held_slots", default=())


class StreamSlot:
    """One of a user's ``MAX_CONCURRENT_STREAMS`` stream slots: a cache key holding
    ``(token, expires_at)`` for ``STREAM_LEASE_SECONDS``."""

    def __init__(self, user, session_key: str | None = None):
        self.prefix = f"ragchat:slot:{_subject(user, session_key)}"
        self.limit = ragchat_settings.MAX_CONCURRENT_STREAMS
        self.token = secrets.token_hex(8)
        self.key: str | None = None

    @staticmethod
    def _lease() -> tuple[float, int]:
        seconds = ragchat_settings.STREAM_LEASE_SECONDS
        return time.time() + seconds, max(1, math.ceil(seconds))

    def acquire(self) -> StreamSlot:
        """Take a free slot, or raise ``LimitExceeded`` (``too_many_streams``)."""
        if not self.limit:
            return self
        keys = [f"{self.prefix}:{i}" for i in range(self.limit)]
        expires_at, timeout = self._lease()
        for key in keys:
            if cache.add(key, (self.token, expires_at), timeout=timeout):
                self.key = key
                return self
        now = time.time()
        leases = [v[1] - now for v in cache.get_many(keys).values() if isinstance(v, (tuple, list))]
        raise LimitExceeded("too_many_streams",
                            f"At most {self.limit} answers can be written at once; wait for one to finish.",
                            retry_after=max(1.0, min(leases, default=1.0)))

    def renew(self) -> None:
        """Extend the lease (re-taking the slot if it lapsed meanwhile)."""
        if self.key is None:
            return
        expires_at, timeout = self._lease()
        value = cache.get(self.key)
        if value is None:
            cache.add(self.key, (self.token, expires_at), timeout=timeout)
        elif isinstance(value, (tuple, list)) and value[0] == self.token:
            cache.set(self.key, (self.token, expires_at), timeout=timeout)

    def release(self) -> None:
        """Free the slot, if it is still this holder's."""
        if self.key is None:
            return
        key, self.key = self.key, None
        value = cache.get(key)
        if isinstance(value, (tuple, list)) and value[0] == self.token:
            cache.delete(key)


def hold(slot: StreamSlot) -> None:
    """Mark ``slot`` as held by the current task: its turn's heartbeat renews it."""
    _held.set((*_held.get(), slot))


def unhold(slot: StreamSlot) -> None:
    _held.set(tuple(s for s in _held.get() if s is not slot))


def renew_held_slots() -> None:
    """Renew the stream slots of the current task (called by ``persistence.Heartbeat``)."""
    for slot in _held.get():
        slot.renew()


@contextlib.contextmanager
def stream_slot(user, session_key: str | None = None):
    """Hold one of the user's ``MAX_CONCURRENT_STREAMS`` slots for the duration of a turn."""
    slot = StreamSlot(user, session_key).acquire()
    hold(slot)
    try:
        yield slot
    finally:
        unhold(slot)
        slot.release()
