"""Iterating an async iterator from synchronous code, item by item, as it produces them.

A WSGI server consumes a response body with a plain ``for`` loop, but the turn pipeline is an
async generator. Django's ``StreamingHttpResponse`` given an async iterator under WSGI reads it
*to the end* before sending anything, so it cannot stream an answer. ``ThreadedStream`` runs
the async iterator on an event loop of its own, in a dedicated thread, and hands each item
over through a queue as soon as it exists::

    stream = ThreadedStream(lambda: transport.turn_events(...))
    for event in stream:   # blocks only until the next event
        ...
    stream.close()         # early: cancels the turn and waits until its partial answer is saved

The loop is started through ``async_to_sync``, exactly like ``pipeline.run_turn_sync``: the
dedicated thread then also serves the iterator's thread-sensitive ``sync_to_async`` calls (the
database work), so one stream uses one database connection, closed when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections

_ITEM, _ERROR, _END = "item", "error", "end"


class ThreadedStream(Iterator):
    """A synchronous iterator over the async iterator ``make_iterator()`` returns.

    ``make_iterator`` is called in the dedicated thread, so the async iterator is created on
    the loop that runs it. An exception raised by the async iterator is raised by ``next()``.
    ``close()`` cancels it (the ``CancelledError`` lands where it awaits, as it would under
    ASGI) and waits up to ``close_timeout`` seconds for it to finish.
    """

    def __init__(self, make_iterator: Callable[[], AsyncIterator[Any]], *, close_timeout: float = 30.0):
        self._make_iterator = make_iterator
        self._close_timeout = close_timeout
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._ready = threading.Event()
        self._exhausted = False
        self._thread = threading.Thread(target=self._run, name="ragchat-stream", daemon=True)
        self._thread.start()

    # -- the dedicated thread --------------------------------------------------------------

    def _run(self) -> None:
        try:
            async_to_sync(self._pump)()
        finally:
            self._ready.set()  # in case the loop never started
            # The thread-sensitive database work of this stream ran on this thread.
            connections.close_all()

    async def _pump(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._ready.set()
        try:
            async with contextlib.aclosing(self._make_iterator()) as items:
                async for item in items:
                    self._items.put((_ITEM, item))
        except asyncio.CancelledError:
            pass  # close() asked for it; the iterator has cleaned up
        except BaseException as exc:  # noqa: BLE001  (handed to the consuming thread)
            self._items.put((_ERROR, exc))
            return
        self._items.put((_END, None))

    # -- the consuming thread ---------------------------------------------------------------

    def __next__(self) -> Any:
        if self._exhausted:
            raise StopIteration
        kind, value = self._items.get()
        if kind == _ITEM:
            return value
        self._exhausted = True
        if kind == _ERROR:
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stop the async iterator if it is still running and wait for it to clean up."""
        self._exhausted = True
        if not self._thread.is_alive():
            return
        self._ready.wait()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed in the meantime
                loop.call_soon_threadsafe(task.cancel)
        self._thread.join(self._close_timeout)
