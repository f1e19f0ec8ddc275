"""Settings of the server processes the recovery tests kill (tests/test_recovery.py): the live
servers' settings with a lease of 90 s, three times the default (a conversation must not wait for
it after a crash, and the test's bound stays far from it on a loaded machine), heartbeats often enough to save some text before the kill, two streams per user and a
turn rate small enough that a retry counted against it would show."""

from tests.live_settings import *  # noqa: F403  (these settings extend the live servers')
from tests.live_settings import RAGCHAT

RAGCHAT = {
    **RAGCHAT,
    "STREAM_HEARTBEAT_SECONDS": 0.3,
    "STREAM_LEASE_SECONDS": 90,
    "SHUTDOWN_GRACE_SECONDS": 5,
    "MAX_CONCURRENT_STREAMS": 2,
    "TURNS_PER_MINUTE": 5,
}
