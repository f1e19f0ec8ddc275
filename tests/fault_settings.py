"""Settings of the server processes the fault tests kill (tests/test_faults.py): the live
servers' settings with short leases, so a dead worker's answers and stream slots expire within
a few seconds, and no per-minute turn limit. 5 s, not 2: with CI's four suites on 2 cores a
live answer's first heartbeat came more than 2 s after its lease was taken (SQLite's write lock
and the CPU both shared), and the answer was closed as a dead worker's."""

from tests.live_settings import *  # noqa: F403  (these settings extend the live servers')
from tests.live_settings import RAGCHAT

RAGCHAT = {
    **RAGCHAT,
    "STREAM_HEARTBEAT_SECONDS": 0.2,
    "STREAM_LEASE_SECONDS": 5.0,
    "SHUTDOWN_GRACE_SECONDS": 10,
    "MAX_CONCURRENT_STREAMS": 2,
    "TURNS_PER_MINUTE": 0,
}
