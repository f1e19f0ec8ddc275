"""Per-user limits on turns, enforced before anything is saved.

* ``TURNS_PER_MINUTE``: a sliding window over the last 60 s, estimated from 10-second buckets
  counted in Django's cache (shared by every worker when the cache is, e.g. Redis or
  Memcached; per process with the local-memory cache): the buckets wholly inside the window
  plus the one before them weighted by the share of it still inside. A burst across a minute
  of the clock gets no second allowance (a fixed window would let twice the limit through in a
  few seconds); the estimate is within one bucket (10 s) of the true window, as it takes the
  oldest bucket's turns as spread evenly.
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
``too_many_streams``. For the rate that is the time until the estimate lets one more turn
through (``rate_wait``), if no other is counted meanwhile. For the slots, while any of them is
being renewed, a short poll, ``STREAM_RETRY_SECONDS`` (1 s): a slot frees when its answer ends,
which nothing foresees and which usually takes well under the lease; the lease's end (up to
``STREAM_LEASE_SECONDS``) is only the latest a slot of a vanished worker frees, so hinting it
would make a user wait for nothing. Being refused costs no turn, so polling each second is
cheap for both sides. Only when no held slot was renewed for two heartbeats (every holder
likely gone) is the hint when the first of them expires (``_slot_wait``).

The settings read here are known to be of the right type and range by the time a turn gets
here: every transport validates the message first, which refuses it, ``settings_invalid``, while
one of them is wrong (``pipeline.check_turn_settings``).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import math
import secrets
import time

from django.core.cache import DEFAULT_CACHE_ALIAS, cache, caches
from django.core.cache.backends.dummy import DummyCache
from django.core.cache.backends.locmem import LocMemCache

from django_ragchat.conf import ragchat_settings
from django_ragchat.turn import workers


class LimitExceeded(Exception):
    def __init__(self, code: str, message: str, retry_after: float):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after


def cache_is_local() -> bool:
    """Whether Django's default cache lives in this process (local memory, or none): its calls
    are a dict and a lock, no I/O, so a turn on the event loop makes them in place instead of
    paying a thread hop for each (``transport.turns``). Redis, Memcached, a database cache: a
    network round trip, made off the loop."""
    return isinstance(caches[DEFAULT_CACHE_ALIAS], (LocMemCache, DummyCache))


def admission_blocks() -> bool:
    """Whether letting a turn through the limits (``Admission.take``, its release and refund) may
    wait on I/O: only when a limit is set and the cache is not in this process. With neither
    limit set nothing is read or written at all."""
    limited = ragchat_settings.TURNS_PER_MINUTE or ragchat_settings.MAX_CONCURRENT_STREAMS
    return bool(limited) and not cache_is_local()


def _subject(user, session_key: str | None) -> str:
    if user is not None and user.is_authenticated:
        return f"u{user.pk}"
    return f"s{session_key or 'none'}"


#: The clock the rate limit reads (seconds since the epoch): tests replace it to fix the time.
clock = time.time

#: The rate limit's buckets: one count per user and ``RATE_BUCKET_SECONDS`` of the clock; the
#: window is ``RATE_WINDOW_SECONDS``, so it spans ``RATE_WINDOW_SECONDS / RATE_BUCKET_SECONDS``
#: buckets and one more, partly. Short buckets keep the estimate within one bucket of the true
#: window (with one-minute buckets a burst at 59 s kept a "2 a minute" user waiting 90 s).
RATE_BUCKET_SECONDS = 10
RATE_WINDOW_SECONDS = 60
_WINDOW_BUCKETS = RATE_WINDOW_SECONDS // RATE_BUCKET_SECONDS

#: ``retry_after`` of ``too_many_streams`` while a held slot is renewed: a slot frees when its
#: answer ends, which nothing foresees; answers usually take a second or a few, and a refusal
#: costs the caller nothing.
STREAM_RETRY_SECONDS = 1.0


def _rate_key(user, session_key: str | None, bucket: int) -> str:
    return f"ragchat:rate:{_subject(user, session_key)}:{bucket}"


# A sliding-window counter written here rather than taken from a library: django-ratelimit
# (and django-ratelimiter's cache strategies) count fixed windows and can neither take a turn
# back nor say how long to wait; the ``limits`` package's sliding window needs a storage of its
# own (its own Redis URL), not Django's cache, which every transport here already shares.
def check_turn_rate(user, session_key: str | None = None) -> int | None:
    """Count one turn for this user; raise ``LimitExceeded`` past ``TURNS_PER_MINUTE``.

    The count is the sliding-window estimate: the turns of the buckets wholly inside the last
    60 s, this one included, plus the bucket before them weighted by the part of it still
    inside (its turns taken as spread evenly over its 10 s). A refused turn is not counted (so
    ``retry_after`` stays true). Concurrent turns may each see the other's count and both be
    refused, never both let through past the limit. Returns the bucket counted in, for
    ``refund_turn``; ``None`` when there is no limit."""
    limit = ragchat_settings.TURNS_PER_MINUTE
    if not limit:
        return None
    bucket, elapsed = divmod(clock(), RATE_BUCKET_SECONDS)
    bucket = int(bucket)
    current = _count_in(_rate_key(user, session_key, bucket))
    earlier = _earlier_counts(user, session_key, bucket)
    counts = [*earlier, current]  # oldest first: the partly counted bucket, ..., this one
    if _estimate(counts, elapsed) <= limit + 1e-6:  # the clock's float rounding, not a turn
        return bucket
    refund_turn(user, session_key, bucket)
    raise LimitExceeded("rate_limited", f"Too many messages: at most {limit} a minute.",
                        retry_after=rate_wait(limit, [*earlier, current - 1], elapsed))


def _earlier_counts(user, session_key: str | None, bucket: int) -> list[int]:
    """The counts of the ``_WINDOW_BUCKETS`` buckets before ``bucket``, oldest first (one read)."""
    keys = [_rate_key(user, session_key, bucket - back) for back in range(_WINDOW_BUCKETS, 0, -1)]
    found = cache.get_many(keys)
    return [max(0, found.get(key) or 0) for key in keys]


def _estimate(counts: list[int], elapsed: float) -> float:
    """The turns in the window, ``elapsed`` seconds into the last of ``counts``' buckets."""
    return sum(counts[1:]) + counts[0] * (1 - elapsed / RATE_BUCKET_SECONDS)


def _count_in(key: str) -> int:
    """Add one to a bucket's count (kept as long as the window reads it); the count with it."""
    timeout = RATE_WINDOW_SECONDS + 2 * RATE_BUCKET_SECONDS
    cache.add(key, 0, timeout=timeout)
    try:
        return cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=timeout)
        return 1


def rate_wait(limit: int, counts: list[int], elapsed: float) -> float:
    """Seconds until one more turn fits under ``limit``, ``elapsed`` seconds into the last of
    ``counts``' buckets (oldest first, as ``_estimate`` reads them), if no other turn is counted
    meanwhile: the first bucket, from this one on, whose whole buckets leave room once the
    partly counted one's weight has decayed enough."""
    size = RATE_BUCKET_SECONDS
    counts = list(counts)
    for ahead in range(len(counts)):  # every count has left the window after as many buckets
        start = elapsed if ahead == 0 else 0.0
        room = limit - 1 - sum(counts[1:])  # what the partly counted bucket may weigh at most
        if room >= 0:
            at = size * (1 - room / counts[0]) if counts[0] > room else 0.0
            if at < size:
                return max(ahead * size + max(at, start) - elapsed, 0.001)
        counts = [*counts[1:], 0]  # the next bucket: the oldest leaves, an empty one starts
    return len(counts) * size - elapsed  # a limit of 1 and a turn in the oldest bucket: once it has left


def refund_turn(user, session_key: str | None, bucket: int | None) -> None:
    """Take back a turn ``check_turn_rate`` counted in ``bucket`` that did not start after all
    (a resend, or another answer being written, found once the turn was admitted): from that
    bucket, whichever minute it is now."""
    if bucket is None:
        return
    with contextlib.suppress(ValueError):  # the bucket's counter expired meanwhile: nothing to take back
        cache.decr(_rate_key(user, session_key, bucket))


# The slots held by the current task (a turn's); its heartbeat renews them.
_held: contextvars.ContextVar[tuple[StreamSlot, ...]] = contextvars.ContextVar("ragchat_held_slots", default=())


class StreamSlot:
    """One of a user's ``MAX_CONCURRENT_STREAMS`` stream slots: a cache key holding
    ``(token, expires_at, holder)`` for ``STREAM_LEASE_SECONDS``; ``holder`` is the worker
    process renewing it (``workers.identity``)."""

    def __init__(self, user, session_key: str | None = None):
        self.prefix = f"ragchat:slot:{_subject(user, session_key)}"
        self.limit = ragchat_settings.MAX_CONCURRENT_STREAMS
        self.token = secrets.token_hex(8) if self.limit else ""  # only a slot taken (acquire) is written
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
        message = (f"At most {self.limit} answers can be written at once; wait for one to finish."
                   if self.limit > 1 else "Another answer of yours is being written; wait for it to finish.")
        raise LimitExceeded("too_many_streams", message, retry_after=_slot_wait(held.values()))

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


def _slot_wait(held) -> float:
    """``retry_after`` when every slot is taken (``held``: their cache values). While any holder
    renews its slot, ``STREAM_RETRY_SECONDS``: that slot frees when its answer ends, which
    nothing foresees and which is usually soon. When none was renewed for two heartbeats (their
    workers are likely gone, on another machine), when the first of them expires."""
    now = time.time()
    lease, stale_after = ragchat_settings.STREAM_LEASE_SECONDS, 2 * ragchat_settings.STREAM_HEARTBEAT_SECONDS
    left = [value[1] - now for value in held if isinstance(value, (tuple, list)) and len(value) > 1]
    if not left or any(lease - remaining <= stale_after for remaining in left):
        return STREAM_RETRY_SECONDS
    return max(STREAM_RETRY_SECONDS, min(left))


def _holder(value) -> str:
    return value[2] if isinstance(value, (tuple, list)) and len(value) > 2 else ""


class Admission:
    """A turn let through the limits: the stream slot it holds and the rate bucket it was
    counted in. ``refund()`` undoes both, for a turn that turned out not to start (a resend, another
    answer being written): a retry never costs the caller their limits."""

    def __init__(self, user, session_key: str | None):
        self.user, self.session_key = user, session_key
        self.slot = StreamSlot(user, session_key)
        self.bucket: int | None = None

    def take(self) -> Admission:
        """Take a slot, then count the turn (``LimitExceeded`` from either; nothing is held then)."""
        self.slot.acquire()
        try:
            self.bucket = check_turn_rate(self.user, self.session_key)
        except BaseException:
            self.slot.release()
            raise
        return self

    def refund(self) -> None:
        """Give back the slot and the turn counted (in the bucket it was counted in)."""
        self.slot.release()
        refund_turn(self.user, self.session_key, self.bucket)
        self.bucket = None


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
