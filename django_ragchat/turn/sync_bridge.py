"""Iterating an async iterator from synchronous code, item by item, as it produces them.

A WSGI server consumes a response body with a plain ``for`` loop, but the turn pipeline is an
async generator. Django's ``StreamingHttpResponse`` given an async iterator under WSGI reads it
*to the end* before sending anything, so it cannot stream an answer. ``ThreadedStream`` runs
the async iterator on an event loop in a dedicated thread and hands each item over through a
queue as soon as it exists::

    stream = ThreadedStream(lambda: transport.turn_events(...))
    for event in stream:   # blocks only until the next event
        ...
    stream.close()         # early: cancels the turn and waits until its partial answer is saved

Every stream of a process shares that one thread and loop (started on first use, and again in
a forked child), as every websocket of an ASGI worker shares the server's: clients pooled per
loop (the ``openai`` backend's) are reused from one answer to the next instead of connecting
again, and the streams' database work goes to asgiref's one thread for thread-sensitive calls,
as under ASGI: a process holds one connection for all of its open streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

_ITEM, _ERROR, _END = "item", "error", "end"

_lock = threading.Lock()
_background: tuple[int, asyncio.AbstractEventLoop, threading.Thread] | None = None


def background_loop() -> asyncio.AbstractEventLoop:
    """The process's event loop for ``ThreadedStream``, running in a daemon thread."""
    global _background
    with _lock:
        if _background is None or _background[0] != os.getpid() or not _background[2].is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="ragchat-streams", daemon=True)
            thread.start()
            _background = (os.getpid(), loop, thread)
        return _background[1]


class ThreadedStream(Iterator):
    """A synchronous iterator over the async iterator ``make_iterator()`` returns.

    ``make_iterator`` is called on the background loop, in a context of its own (nothing of
    the calling thread's). An exception raised by the async iterator is raised by ``next()``.
    ``close()`` cancels it (the ``CancelledError`` lands where it awaits, as it would under
    ASGI) and waits up to ``close_timeout`` seconds for it to finish.
    """

    def __init__(self, make_iterator: Callable[[], AsyncIterator[Any]], *, close_timeout: float = 30.0):
        self._close_timeout = close_timeout
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._finished = threading.Event()
        self._exhausted = False
        self._task: asyncio.Task | None = None
        self._loop = background_loop()
        # An empty context, not a copy of the caller's: asgiref keeps in contextvars which
        # thread runs thread-sensitive code, and the caller's thread (a request's) moves on.
        self._loop.call_soon_threadsafe(self._start, make_iterator, context=contextvars.Context())

    def _start(self, make_iterator: Callable[[], AsyncIterator[Any]]) -> None:
        self._task = self._loop.create_task(self._pump(make_iterator), context=contextvars.Context())

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _pump(self, make_iterator: Callable[[], AsyncIterator[Any]]) -> None:
        try:
            async with contextlib.aclosing(make_iterator()) as items:
                async for item in items:
                    self._items.put((_ITEM, item))
        except asyncio.CancelledError:
            self._items.put((_END, None))  # close() asked for it; the iterator has cleaned up
            raise
        except BaseException as exc:  # noqa: BLE001  (handed to the consuming thread)
            self._items.put((_ERROR, exc))
        else:
            self._items.put((_END, None))
        finally:
            self._finished.set()

    def __next__(self) -> Any:
        return self.next_within(None)

    def next_within(self, timeout: float | None) -> Any:
        """``next()``, waiting at most ``timeout`` seconds (``None``: as long as it takes);
        ``TimeoutError`` when no item came meanwhile (the stream goes on)."""
        if self._exhausted:
            raise StopIteration
        try:
            kind, value = self._items.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None
        if kind == _ITEM:
            return value
        self._exhausted = True
        if kind == _ERROR:
            raise value
        raise StopIteration

    def next_ready(self) -> Any | None:
        """The next item if it is already waiting, else ``None``; never blocks (the end and an
        exception stay for ``next()``)."""
        if self._exhausted:
            return None
        try:
            kind, value = self._items.get_nowait()
        except queue.Empty:
            return None
        if kind == _ITEM:
            return value
        self._items.put((kind, value))  # the last entry: putting it back keeps the order
        return None

    def close(self) -> None:
        """Stop the async iterator if it is still running and wait for it to clean up."""
        self._exhausted = True
        if not self._finished.is_set():
            self._loop.call_soon_threadsafe(self._cancel)  # after _start: callbacks run in order
            self._finished.wait(self._close_timeout)
