"""Per-user limits on turns, enforced before anything is saved.

* ``TURNS_PER_MINUTE``: a fixed one-minute window counted in Django's cache (shared by every
  worker when the cache is, e.g. Redis or Memcached; per process with the local-memory cache).
* ``MAX_CONCURRENT_STREAMS``: answers being written at once for one user. Each answer holds a
  *slot*: one of ``MAX_CONCURRENT_STREAMS`` cache keys, taken with ``cache.add`` and expiring
  after ``STREAM_LEASE_SECONDS`` unless renewed. The turn's heartbeat renews the slots its task
  holds (``renew_held_slots``), so a slot follows its holder: released when the turn ends, and
  when the worker holding it was killed, at once by the next request that needs it if that
  worker was on this machine (``workers.is_dead``), else by expiry within one lease. No counter
  can leak.

A turn that does not start after all (a resend answered with the first attempt's result,
another answer still being written) gives both back (``Admission.refund``).

A refusal raises ``LimitExceeded`` with a ``retry_after`` in seconds: HTTP transports answer
429 with ``Retry-After``, the websocket an ``error`` event with code ``rate_limited`` or
``too_many_streams``. For the rate that is the start of the next minute; for the slots, when
the first held slot's lease runs out unless renewed (a turn that ends frees its slot sooner).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import math
import secrets
import time

from django.core.cache import cache

from django_ragchat.conf import ragchat_settings
from django_ragchat.turn import workers


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


def _rate_key(user, session_key: str | None, window: int) -> str:
    return f"ragchat:rate:{_subject(user, session_key)}:{window}"


def check_turn_rate(user, session_key: str | None = None) -> int | None:
    """Count one turn for this user; raise ``LimitExceeded`` past ``TURNS_PER_MINUTE``. Returns
    the minute counted in (for ``refund_turn``), ``None`` when there is no limit."""
    limit = ragchat_settings.TURNS_PER_MINUTE
    if not limit:
        return None
    window = int(time.time() // 60)
    key = _rate_key(user, session_key, window)
    cache.add(key, 0, timeout=120)
    try:
        count = cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=120)
        count = 1
    if count > limit:
        raise LimitExceeded("rate_limited", f"Too many messages: at most {limit} a minute.",
                            retry_after=60 - time.time() % 60)
    return window


def refund_turn(user, session_key: str | None, window: int | None) -> None:
    """Take back a turn ``check_turn_rate`` counted in ``window`` that did not start after all
    (a resend, or another answer being written, found once the turn was admitted)."""
    if window is None:
        return
    with contextlib.suppress(ValueError):  # the window's counter expired meanwhile: nothing to take back
        cache.decr(_rate_key(user, session_key, window))


# The slots held by the current task (a turn's); its heartbeat renews them.
_held: contextvars.ContextVar[tuple[StreamSlot, ...]] = contextvars.ContextVar("ragchat_held_slots", default=())


class StreamSlot:
    """One of a user's ``MAX_CONCURRENT_STREAMS`` stream slots: a cache key holding
    ``(token, expires_at, holder)`` for ``STREAM_LEASE_SECONDS``; ``holder`` is the worker
    process renewing it (``workers.identity``)."""

    def __init__(self, user, session_key: str | None = None):
        self.prefix = f"ragchat:slot:{_subject(user, session_key)}"
        self.limit = ragchat_settings.MAX_CONCURRENT_STREAMS
        self.token = secrets.token_hex(8)
        self.key: str | None = None

    def _value(self) -> tuple[str, float, str]:
        seconds = ragchat_settings.STREAM_LEASE_SECONDS
        return self.token, time.time() + seconds, workers.identity()

    @staticmethod
    def _timeout() -> int:
        return max(1, math.ceil(ragchat_settings.STREAM_LEASE_SECONDS))

    def acquire(self) -> StreamSlot:
        """Take a free slot, or one held by a worker that is gone (``workers.is_dead``), or
        raise ``LimitExceeded`` (``too_many_streams``)."""
        if not self.limit:
            return self
        keys = [f"{self.prefix}:{i}" for i in range(self.limit)]
        if self._add_any(keys):
            return self
        for _ in range(3):  # others may be freeing and taking slots at the same time
            held = cache.get_many(keys)
            dead = [key for key, value in held.items() if _holder(value) and workers.is_dead(_holder(value))]
            if dead:
                cache.delete_many(dead)  # a killed worker's slots: free them now, not at their expiry
            if self._add_any([key for key in keys if key not in held] + dead):
                return self
            if not dead and len(held) == len(keys):
                break
        now = time.time()
        leases = [v[1] - now for v in held.values() if isinstance(v, (tuple, list))]
        raise LimitExceeded("too_many_streams",
                            f"At most {self.limit} answers can be written at once; wait for one to finish.",
                            retry_after=max(1.0, min(leases, default=1.0)))

    def _add_any(self, keys) -> bool:
        value = self._value()
        for key in keys:
            if cache.add(key, value, timeout=self._timeout()):
                self.key = key
                return True
        return False

    def renew(self) -> None:
        """Extend the lease (re-taking the slot if it lapsed meanwhile)."""
        if self.key is None:
            return
        value = cache.get(self.key)
        if value is None:
            cache.add(self.key, self._value(), timeout=self._timeout())
        elif isinstance(value, (tuple, list)) and value[0] == self.token:
            cache.set(self.key, self._value(), timeout=self._timeout())

    def release(self) -> None:
        """Free the slot, if it is still this holder's."""
        if self.key is None:
            return
        key, self.key = self.key, None
        value = cache.get(key)
        if isinstance(value, (tuple, list)) and value[0] == self.token:
            cache.delete(key)


def _holder(value) -> str:
    return value[2] if isinstance(value, (tuple, list)) and len(value) > 2 else ""


class Admission:
    """A turn let through the limits: the stream slot it holds and the minute it was counted
    in. ``refund()`` undoes both, for a turn that turned out not to start (a resend, another
    answer being written): a retry never costs the caller their limits."""

    def __init__(self, user, session_key: str | None):
        self.user, self.session_key = user, session_key
        self.slot = StreamSlot(user, session_key)
        self.window: int | None = None

    def take(self) -> Admission:
        """Take a slot, then count the turn (``LimitExceeded`` from either; nothing is held then)."""
        self.slot.acquire()
        try:
            self.window = check_turn_rate(self.user, self.session_key)
        except BaseException:
            self.slot.release()
            raise
        return self

    def refund(self) -> None:
        self.slot.release()
        refund_turn(self.user, self.session_key, self.window)
        self.window = None


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


@contextlib.contextmanager
def admitted(user, session_key: str | None = None):
    """Let one turn through the limits for the duration of the block (``Admission.take``; its
    slot renewed by the turn's heartbeat, released at the end). The block calls ``refund()``
    on the admission when the turn did not start after all."""
    admission = Admission(user, session_key).take()
    hold(admission.slot)
    try:
        yield admission
    finally:
        unhold(admission.slot)
        admission.slot.release()


class FirstSend:
    """Claims the first send of a message that starts a conversation, by its ``client_id``: two
    attempts at once (a client retrying while its first request is still on its way) must not
    start two conversations. The claim lasts until the message is saved (then a resend finds it
    in the database) or at most ``STREAM_LEASE_SECONDS``."""

    def __init__(self, user, session_key: str | None, client_id: str):
        digest = hashlib.sha256(client_id.encode()).hexdigest()[:32]
        self.key = f"ragchat:first:{_subject(user, session_key)}:{digest}"
        self.token = secrets.token_hex(8)
        self.held = False

    def claim(self) -> bool:
        """Whether this attempt is the one that goes on (no other holds the claim)."""
        self.held = cache.add(self.key, self.token, timeout=max(1, math.ceil(ragchat_settings.STREAM_LEASE_SECONDS)))
        return self.held

    def release(self) -> None:
        if self.held:
            self.held = False
            if cache.get(self.key) == self.token:
                cache.delete(self.key)
