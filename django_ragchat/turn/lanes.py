"""Database lanes: a few threads for the turns' database work instead of one.

asgiref's ``sync_to_async`` runs every thread-sensitive call of a process on ONE thread when
no request context says otherwise (Channels' consumers do not set one). A websocket worker
answering many turns at once then runs each turn's database work (the two inserts, memory,
retrieval) one after another, and every I/O wait (a commit, a PostgreSQL round trip) holds
up every other turn.

``database_lane()`` gives the block it wraps one of ``DATABASE_THREADS`` long-lived threads
for all its thread-sensitive work (asgiref's ``ThreadSensitiveContext`` with an executor):
the calls of one turn stay on one thread, in order, so Django's thread-bound connections and
transactions behave as before, while different turns use different threads. The lane with
the fewest turns is chosen. Each thread keeps its own database connection, closed or reused
by ``CONN_MAX_AGE`` (and ``transport.close_stale_connections``) as usual, so a site needs up
to ``DATABASE_THREADS`` more connections per worker process. While a lane serves several turns
at once (a burst), a turn that starts there keeps the lane's connection, whatever its age,
instead of opening one per turn (``CONN_MAX_AGE`` 0); broken connections are closed all the same.
A lane's SQLite connection is kept whatever ``CONN_MAX_AGE`` says (no server holds it).

Nothing changes (the block runs as before) when:

* an outer ``async_to_sync`` is running the code (a test's thread and transaction, WSGI's
  ``run_turn_sync``): its thread must keep doing the work;
* ``DATABASE_THREADS`` is 1 or less;
* asgiref is older than 3.13 (no ``ThreadSensitiveContext(executor=...)``).
"""

from __future__ import annotations

import inspect
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Self

from asgiref.sync import AsyncToSync, ThreadSensitiveContext
from django.db import connections

from django_ragchat.conf import ragchat_settings

#: Whether this asgiref lets a context choose its executor (3.13+).
SUPPORTED = "executor" in inspect.signature(ThreadSensitiveContext).parameters


class _Lanes:
    """The process's lanes: single-thread executors and how many blocks each one serves."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.executors: list[ThreadPoolExecutor] = []
        self.busy: list[int] = []

    def take(self, size: int) -> int:
        with self.lock:
            while len(self.executors) < size:
                self.executors.append(ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=f"ragchat-db-{len(self.executors)}",
                    initializer=_name_lane, initargs=(len(self.executors),)))
                self.busy.append(0)
            index = min(range(size), key=self.busy.__getitem__)
            self.busy[index] += 1
            return index

    def give_back(self, index: int) -> None:
        with self.lock:
            self.busy[index] -= 1

    def close_connections(self) -> None:
        with self.lock:
            executors = list(self.executors)
        for executor in executors:
            executor.submit(connections.close_all).result()


_lanes = _Lanes()
_thread = threading.local()  # .lane: the index of the lane a lane's thread serves


def _name_lane(index: int) -> None:
    _thread.lane = index


def shared() -> bool:
    """Whether the calling thread is a lane's and serves other blocks besides the caller's
    (a burst of turns): its database connection is in use by them, so a turn starting there
    keeps it instead of closing it by ``CONN_MAX_AGE`` (``transport.close_stale_connections``)."""
    index = getattr(_thread, "lane", None)
    return index is not None and _lanes.busy[index] > 1


def on_lane() -> bool:
    """Whether the calling thread is one of the lanes' threads."""
    return getattr(_thread, "lane", None) is not None


def close_connections() -> None:
    """Close the database connections held by the lanes' threads (each thread keeps its own,
    as Django's request threads do). For a process about to drop or leave its databases: a
    test session before it destroys the test database, a worker shutting down."""
    _lanes.close_connections()


def lane_count() -> int:
    """How many lanes blocks are spread over (1: asgiref's single thread, nothing changes)."""
    if not SUPPORTED:
        return 1
    size = ragchat_settings.DATABASE_THREADS
    # A bad value is reported by the system check (ragchat.E007); turns still run meanwhile.
    return size if isinstance(size, int) and size > 1 else 1


class database_lane:  # lower case: used like a function, ``async with database_lane():``
    """Async context manager: the thread-sensitive calls in the block run on one lane's thread.

    Every task the block creates must finish inside it (asgiref refuses later calls).
    """

    def __init__(self) -> None:
        self.index: int | None = None
        self.context: ThreadSensitiveContext | None = None

    @property
    def on_lane(self) -> bool:
        """Whether the block's thread-sensitive calls run on a lane (else where they ran before)."""
        return self.context is not None

    async def __aenter__(self) -> Self:
        size = lane_count()
        if size <= 1 or getattr(AsyncToSync.executors, "current", None) is not None:
            return self
        self.index = _lanes.take(size)
        self.context = ThreadSensitiveContext(executor=_lanes.executors[self.index])
        try:
            await self.context.__aenter__()
        except BaseException:
            _lanes.give_back(self.index)
            raise
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self.context is None:
            return
        try:
            await self.context.__aexit__(exc_type, exc, tb)
        finally:
            _lanes.give_back(self.index)
