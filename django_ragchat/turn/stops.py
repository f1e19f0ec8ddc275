"""Stopping an answer from anywhere: a Stop from a client that is not the one receiving the
answer (another tab, a page opened again after it was left, a REST client), whichever
transport and process write it.

While its stages run, a turn is registered here (``Stoppable``, by conversation: one answer
is written at a time in a conversation). ``request_stop(conversation_id)`` writes the request
to the database (``Message.stop_requested_at``; the answer's calls waiting for the user's
approval become ``cancelled``, so that nobody decides them any more) and stops the turn at once
when it runs in this process. A turn in another process reads the request from the database:
while it waits for an approval, within ``confirmations.POLL_SECONDS`` (its call's row says
``cancelled``); otherwise at its next heartbeat (``STREAM_HEARTBEAT_SECONDS``,
``persistence.Heartbeat``).

A turn stopped this way saves its partial answer as ``incomplete`` (its calls still running or
waiting ``cancelled``) and ends with an ``error`` event ``cancelled`` carrying it
(``pipeline.stream_turn``), on whatever transport it runs: the socket or the stream that sent the
message, if it is still there, hears that the answer was stopped. The stop is a cancellation
of the task that runs the turn, as a client's own Stop or disconnect is, so a tool is stopped
the same way (docs/tools.md, "Stop").
"""

from __future__ import annotations

import asyncio
import threading

from django.db import transaction
from django.utils import timezone

from django_ragchat.models import Message, ToolInvocation

_lock = threading.Lock()
_running: dict[str, Stoppable] = {}  # conversation id -> the turn writing its answer in this process


class Stoppable:
    """A turn that ``request_stop`` may stop while the block runs: registered by its
    conversation with the task that runs it (the one iterating ``stream_turn``).

    ``requested`` turns true when it was stopped that way (the task's ``CancelledError`` is then
    a stop to report, not a client gone). Leaving the block (the answer is being saved) ends
    the window: a stop that comes later finds the answer finished."""

    def __init__(self, conversation_id):
        self.key = str(conversation_id)
        self.requested = False
        self.active = False
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> Stoppable:
        self._task, self._loop = asyncio.current_task(), asyncio.get_running_loop()
        self.active = True
        with _lock:
            _running[self.key] = self
        return self

    def __exit__(self, *exc_info) -> None:
        self.active = False
        with _lock:
            if _running.get(self.key) is self:
                del _running[self.key]

    def stop(self) -> None:
        """Cancel the turn's task, from any thread."""
        try:
            self._loop.call_soon_threadsafe(self._cancel)
        except RuntimeError:  # its loop is closed: the turn is over
            pass

    def _cancel(self) -> None:
        # Once, and not over a cancellation already under way (the client's own Stop or
        # disconnect, a shutdown): a second one would interrupt the saving of the first.
        if not self.active or self.requested or self._task.done() or self._task.cancelling():
            return
        self.requested = True
        self._task.cancel()


def stop_here(conversation_id) -> bool:
    """Stop the answer being written in the conversation if this process writes it; whether it does."""
    with _lock:
        stoppable = _running.get(str(conversation_id))
    if stoppable is None:
        return False
    stoppable.stop()
    return True


def request_stop(conversation_id) -> int | None:
    """Ask the answer being written in the conversation to stop, wherever it runs: the
    assistant message's id, ``None`` when no answer is being written there. No permission
    check (the callers make it: the REST API's ``cancel``, the websocket's ``cancel``).
    Synchronous (three queries)."""
    now = timezone.now()
    with transaction.atomic():
        streaming = Message.objects.filter(conversation_id=conversation_id, status=Message.Status.STREAMING)
        message_id = streaming.values_list("pk", flat=True).first()
        if message_id is None or not streaming.filter(pk=message_id).update(stop_requested_at=now):
            return None
        ToolInvocation.objects.filter(message_id=message_id, status=ToolInvocation.Status.PENDING).update(
            status=ToolInvocation.Status.CANCELLED, updated_at=now)
    stop_here(conversation_id)
    return message_id
