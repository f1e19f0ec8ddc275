"""The per-user limits (``turn/limits.py``) on their own: the sliding-window turn rate, its
``retry_after`` and refunds, and the stream slots' retry hint. The rate tests stop the limits'
clock (``limits_clock``) and move it by hand, so no test waits for or races a minute of the
clock."""

from __future__ import annotations

import math
import time

import pytest
from django.core.cache import cache

from django_ragchat.turn import limits

MINUTE = 29_000_000  # a rate bucket (minute of the clock) for the tests to start in


@pytest.fixture(autouse=True)
def _clear_limits():
    cache.clear()
    yield
    cache.clear()


def admitted(user, attempts: int) -> int:
    """How many of ``attempts`` turns, asked for now, ``check_turn_rate`` lets through."""
    let_through = 0
    for _ in range(attempts):
        try:
            limits.check_turn_rate(user)
        except limits.LimitExceeded:
            continue
        let_through += 1
    return let_through


def refusal(user) -> limits.LimitExceeded:
    with pytest.raises(limits.LimitExceeded) as refused:
        limits.check_turn_rate(user)
    assert refused.value.code == "rate_limited"
    return refused.value


def bucket_at(minute: int, second: float) -> int:
    """The rate bucket the clock is in ``second`` seconds into ``minute``."""
    return int((minute * 60 + second) // limits.RATE_BUCKET_SECONDS)


def test_a_burst_across_a_minute_of_the_clock_gets_no_second_allowance(user, limits_clock, ragchat_settings_override):
    ragchat_settings_override(TURNS_PER_MINUTE=10)
    limits_clock.at(MINUTE, 59.0)
    assert admitted(user, 15) == 10
    # Two seconds later, in the next minute: a fixed window would let ten more through.
    limits_clock.at(MINUTE + 1, 1.0)
    assert admitted(user, 15) == 0
    # Half a minute on, the burst is still inside the last 60 s: nothing more.
    limits_clock.at(MINUTE + 1, 30.0)
    assert admitted(user, 15) == 0
    # 56 s after the burst its bucket (50-60 s) is half outside the window: it weighs five.
    limits_clock.at(MINUTE + 1, 55.0)
    assert admitted(user, 15) == 5
    # The refused attempts counted nothing.
    assert cache.get(limits._rate_key(user, None, bucket_at(MINUTE + 1, 55.0))) == 5


def test_a_bursts_wait_is_within_one_bucket_of_the_true_window(user, limits_clock, ragchat_settings_override):
    # Two turns at 59 s, "2 a minute": the true window frees one at 119 s, 59.5 s after the
    # refusal. Their bucket is taken as spread over 50-60 s: half of it has left at 115 s. Two
    # one-minute buckets, spreading them over the whole minute, made it 90.5 s.
    ragchat_settings_override(TURNS_PER_MINUTE=2)
    limits_clock.at(MINUTE, 59.0)
    assert admitted(user, 2) == 2
    limits_clock.at(MINUTE, 59.5)
    wait = refusal(user).retry_after
    assert wait == pytest.approx(55.5)
    assert abs(wait - 59.5) <= limits.RATE_BUCKET_SECONDS
    limits_clock.advance(wait)
    assert admitted(user, 2) == 1


@pytest.mark.parametrize(("earlier", "now", "expected_wait"), [
    # Ten turns at 59 s, refused at 59.5 s: once their bucket (50-60 s) weighs at most nine,
    # 1 s into the bucket 60 s after theirs (the true window: at 119 s, 59.5 s).
    ([(MINUTE, 59.0, 10)], (MINUTE, 59.5), 60.0 + 1.0 - 9.5),
    # Six turns 50 s ago, four now: once the six, spread over their bucket, weigh at most five
    # (the true window: 10 s).
    ([(MINUTE - 1, 10.0, 6), (MINUTE, 0.0, 4)], (MINUTE, 0.0), 10.0 + 10 / 6),
    # Three 45 s ago and seven 3 s ago: once the three weigh at most two (true: 15 s).
    ([(MINUTE - 1, 30.0, 3), (MINUTE, 12.0, 7)], (MINUTE, 15.0), 20.0 + 10 / 3 - 5.0),
])
def test_retry_after_is_the_wait_the_estimate_says(user, limits_clock, ragchat_settings_override, earlier, now,
                                                   expected_wait):
    ragchat_settings_override(TURNS_PER_MINUTE=10)
    for minute, second, turns in earlier:
        limits_clock.at(minute, second)
        assert admitted(user, turns) == turns
    limits_clock.at(*now)
    wait = refusal(user).retry_after
    assert wait == pytest.approx(expected_wait)
    limits_clock.advance(wait - 0.01)
    refusal(user)  # a moment early: still refused (and that try counted nothing)
    limits_clock.advance(0.01)
    assert admitted(user, 1) == 1


def test_a_limit_of_one_waits_for_the_turn_to_leave_the_window(user, limits_clock, ragchat_settings_override):
    ragchat_settings_override(TURNS_PER_MINUTE=1)
    limits_clock.at(MINUTE, 25.0)
    assert admitted(user, 1) == 1
    wait = refusal(user).retry_after
    assert wait == pytest.approx(70.0 - 5.0)  # its bucket (20-30 s) wholly outside: at 90 s
    limits_clock.advance(wait - 0.01)
    refusal(user)
    limits_clock.advance(0.01)
    assert admitted(user, 2) == 1


def test_a_refund_takes_the_turn_back_from_the_bucket_it_was_counted_in(user, limits_clock, ragchat_settings_override):
    ragchat_settings_override(TURNS_PER_MINUTE=2)
    limits_clock.at(MINUTE, 50.0)
    first = limits.check_turn_rate(user)
    limits.check_turn_rate(user)
    limits_clock.at(MINUTE + 1, 5.0)
    refusal(user)  # both turns are 15 s old
    limits.refund_turn(user, None, first)  # the first turn did not start after all
    assert first == bucket_at(MINUTE, 50.0)
    assert cache.get(limits._rate_key(user, None, first)) == 1
    assert admitted(user, 3) == 1


def test_an_admission_refunded_costs_neither_a_turn_nor_a_slot(user, limits_clock, ragchat_settings_override):
    ragchat_settings_override(TURNS_PER_MINUTE=1, MAX_CONCURRENT_STREAMS=1)
    limits_clock.at(MINUTE, 59.9)
    admission = limits.Admission(user, None).take()
    limits_clock.at(MINUTE + 1, 0.5)  # refunded in the next bucket: from the one it was counted in
    admission.refund()
    assert cache.get(limits._rate_key(user, None, bucket_at(MINUTE, 59.9))) == 0
    limits.Admission(user, None).take().refund()


def test_no_limit_counts_nothing(user, limits_clock, ragchat_settings_override):
    ragchat_settings_override(TURNS_PER_MINUTE=0)
    assert limits.check_turn_rate(user) is None
    assert admitted(user, 100) == 100
    limits.refund_turn(user, None, None)


def test_too_many_streams_asks_for_a_short_retry_while_the_slots_are_young(user, ragchat_settings_override):
    # The slots were just taken and renew for 30 s: their answers usually end in well under a
    # second, so the hint is a short poll, not the lease's end.
    ragchat_settings_override(MAX_CONCURRENT_STREAMS=2, STREAM_LEASE_SECONDS=30)
    held = [limits.StreamSlot(user).acquire() for _ in range(2)]
    with pytest.raises(limits.LimitExceeded) as refused:
        limits.StreamSlot(user).acquire()
    assert refused.value.code == "too_many_streams"
    assert 0 < refused.value.retry_after <= 1
    held[0].release()  # an answer ends: its slot is free at once
    assert limits.StreamSlot(user).acquire().key == held[0].prefix + ":0"


def hold_slots(user, *seconds_left: float) -> None:
    """The user's slots held by another worker's answers, each expiring in so many seconds."""
    prefix = limits.StreamSlot(user).prefix
    for i, left in enumerate(seconds_left):
        cache.set(f"{prefix}:{i}", ("token", time.time() + left, "another-worker"), timeout=math.ceil(left))


def test_slots_nobody_renews_free_when_the_first_expires(user, ragchat_settings_override):
    ragchat_settings_override(MAX_CONCURRENT_STREAMS=2, STREAM_LEASE_SECONDS=30, STREAM_HEARTBEAT_SECONDS=5)
    hold_slots(user, 12, 20)  # renewed 18 s and 10 s ago: more than two heartbeats
    with pytest.raises(limits.LimitExceeded) as refused:
        limits.StreamSlot(user).acquire()
    assert 11 < refused.value.retry_after <= 12
    hold_slots(user, 12, 26)  # the second one is being renewed: its answer may end any moment
    with pytest.raises(limits.LimitExceeded) as refused:
        limits.StreamSlot(user).acquire()
    assert refused.value.retry_after == limits.STREAM_RETRY_SECONDS


@pytest.mark.django_db
def test_two_sends_at_once_the_loser_is_refused_turn_in_progress_not_too_many_streams(
        ragchat_settings_override, product_corpus, user):
    """The conversation was read before the other answer started (no pending check was due), and
    that answer holds the caller's one slot: the refusal names the answer in this conversation
    (409 turn_in_progress), as it does when a slot is free, not the slots (429)."""
    from asgiref.sync import async_to_sync
    from django.utils import timezone

    from django_ragchat.models import Conversation, Message
    from django_ragchat.transport.turns import TurnRefused, turn_events
    from django_ragchat.turn import persistence

    ragchat_settings_override(MAX_CONCURRENT_STREAMS=1)
    Conversation.objects.create(owner=user)
    conversation = persistence.with_pending(Conversation.objects.all()).get()  # nothing pending yet
    Message.objects.create(conversation=conversation, seq=1, role="assistant", status="streaming",
                           lease_holder="", lease_expires_at=timezone.now() + timezone.timedelta(seconds=30))

    async def main():
        async for _event in turn_events(conversation, "How much does the Aurora X2 cost?", user=user, session_key=None):
            pass

    with limits.stream_slot(user), pytest.raises(TurnRefused) as refused:  # the other answer's slot
        async_to_sync(main)()
    assert (refused.value.code, refused.value.http_status, refused.value.retry_after) == ("turn_in_progress", 409, 1)
