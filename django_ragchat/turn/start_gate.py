"""The start gate: at most ``STARTING_TURNS`` turns of a process do their work before the model
at once; the others wait at the gate in the order they arrived.

A turn's work before the model (the checks, saving the message, memory, retrieval, the prompt)
is CPU work of the worker process. When 100 messages arrive in the same instant, running all
of them at once interleaves their steps on the event loop and the database lanes, so every
turn reaches the model near the end of the burst: the median turn waits for almost all the
burst's work. First come, first served, the first turns reach the model after their own work
and the median one after about half the burst's: the same total work, the waits spread
from short to long instead of all long (the shortest-queue rule of any admission queue).

The gate is per event loop (an ``asyncio.Semaphore``, which wakes its waiters in order). A
turn passes it in ``transport.turn_events`` (``passing()``) and gives its place back as soon
as the model is called (``model_called()``, from ``pipeline.generate``) or when the turn ends
before that, whichever comes first: a slow model, a tool waiting for the user's confirmation,
a long answer never hold the gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import weakref
from collections.abc import AsyncIterator

from django_ragchat.conf import ragchat_settings

_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[int, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary())


class _Place:
    """A turn's place through the gate, given back once."""

    def __init__(self, gate: asyncio.Semaphore) -> None:
        self.gate: asyncio.Semaphore | None = gate

    def give_back(self) -> None:
        if self.gate is not None:
            self.gate.release()
            self.gate = None


# The place of the turn running in this task (and in the tasks it starts: they copy it).
_place: contextvars.ContextVar[_Place | None] = contextvars.ContextVar("ragchat_start_gate_place", default=None)


def size() -> int:
    """How many turns may be before their model at once; 0: no gate."""
    value = ragchat_settings.STARTING_TURNS
    # A bad value is reported by the system check (ragchat.E007); turns still run meanwhile.
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _gate(limit: int) -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    found = _gates.get(loop)
    if found is None or found[0] != limit:  # a changed setting (tests) makes a new gate
        found = _gates[loop] = (limit, asyncio.Semaphore(limit))
    return found[1]


@contextlib.asynccontextmanager
async def passing() -> AsyncIterator[None]:
    """Wait for a place, then hold it until ``model_called()`` or the end of the block."""
    limit = size()
    held = _place.get()
    if not limit or (held is not None and held.gate is not None):  # no gate, or holding a place
        yield
        return
    gate = _gate(limit)
    await gate.acquire()
    place = _Place(gate)
    token = _place.set(place)
    try:
        yield
    finally:
        place.give_back()
        with contextlib.suppress(ValueError):  # closed from another context (a collected generator)
            _place.reset(token)


def model_called() -> None:
    """The turn's work before the model is done: its place goes to the next turn waiting."""
    place = _place.get()
    if place is not None:
        place.give_back()
