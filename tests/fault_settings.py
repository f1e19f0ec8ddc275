"""Settings of the server processes the fault tests kill (tests/test_faults.py): the live
servers' settings with short leases, so a dead worker's answers and stream slots expire within
about a second, and no per-minute turn limit."""

from tests.live_settings import *  # noqa: F403  (these settings extend the live servers')
from tests.live_settings import RAGCHAT

RAGCHAT = {
    **RAGCHAT,
    "STREAM_HEARTBEAT_SECONDS": 0.2,
    "STREAM_LEASE_SECONDS": 2.0,
    "SHUTDOWN_GRACE_SECONDS": 10,
    "MAX_CONCURRENT_STREAMS": 2,
    "TURNS_PER_MINUTE": 0,
}
