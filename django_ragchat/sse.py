"""Server-sent events: a turn streamed over a plain HTTP response, for clients without
websockets and for sites served by WSGI.

``POST <prefix>/conversations/<uuid>/stream/`` with ``{"content": "..."}`` answers
``text/event-stream``; each event of the turn (the websocket's vocabulary, docs/protocol.md)
is one SSE message::

    event: delta
    data: {"type": "delta", "text": "The ", "index": 0}

A request that cannot start a turn is answered with an HTTP error status instead of a stream,
its body the ``error`` event as JSON (404 unknown or foreign conversation, 400/413 invalid
message, 403 not yours to change, 409 turn in progress, 429 limits with ``Retry-After``).
Session authentication, so the request carries the CSRF token (``X-CSRFToken`` header).

The same view serves both deployments: under ASGI it iterates the turn on the server's event
loop; under WSGI it runs the turn in a ``ThreadedStream`` (Django would otherwise buffer an
async body whole). Either way a client that goes away stops the model and the partial answer
is saved as "incomplete".
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.core.handlers.asgi import ASGIRequest
from django.http import JsonResponse, StreamingHttpResponse
from django.views.decorators.http import require_POST

from django_ragchat import transport
from django_ragchat.events import PROTOCOL_VERSION, TurnEvent
from django_ragchat.sync_stream import ThreadedStream
from django_ragchat.transport import TurnRefused


def encode_event(event: TurnEvent) -> bytes:
    """One SSE message: ``event:`` the type, ``data:`` the event's JSON on one line."""
    data = event.to_dict()
    # json.dumps escapes newlines (and non-ASCII), so the data always fits on one line.
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def refusal_response(refusal: TurnRefused) -> JsonResponse:
    return JsonResponse(refusal.to_event().to_dict(), status=refusal.http_status, headers=refusal.http_headers())


def _read_content(request) -> Any:
    """The ``content`` of the JSON body (validated later, with the turn); ``TurnRefused`` for a
    body that is too large or not a JSON object."""
    too_large = TurnRefused("too_large", "The request body is too large.", 413)
    try:
        # Read even when too long (up to Django's DATA_UPLOAD_MAX_MEMORY_SIZE): a server that
        # answers before the client finished sending resets the connection, and the client
        # never reads the 413.
        body = request.body
    except RequestDataTooBig:
        raise too_large from None
    if len(body) > transport.max_request_chars():
        raise too_large
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise TurnRefused("parse_error", 'The body must be JSON: {"content": "..."}.', 400) from None
    if not isinstance(data, dict):
        raise TurnRefused("invalid_type", 'The body must be a JSON object: {"content": "..."}.', 400)
    return data.get("content")


async def turn_stream(user, session_key: str | None, conversation_id, content: Any) -> AsyncIterator[TurnEvent]:
    """The events of one turn for this caller: the conversation is opened, then the turn runs
    (``TurnRefused`` before the first event when either cannot happen)."""
    conversation, _ = await transport.open_conversation(user, conversation_id, session_key, for_sending=True)
    async with contextlib.aclosing(
        transport.turn_events(conversation, content, user=user, session_key=session_key)
    ) as events:
        async for event in events:
            yield event


def _event_stream_response(body) -> StreamingHttpResponse:
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on, don't buffer the response
    response["X-Ragchat-Protocol"] = str(PROTOCOL_VERSION)
    return response


class _AsyncBody:
    """The response body under ASGI: the turn's events, iterated on the server's loop.

    Django cancels the response when the client disconnects. If that happens while the turn is
    awaiting (the model, the database), the ``CancelledError`` lands in the turn and it saves
    its partial answer. If it happens while Django is writing an event, the turn sits at a
    ``yield`` instead; Django then calls ``close()`` (from a worker thread), which closes the
    turn so it saves its partial answer just the same.
    """

    def __init__(self, first: TurnEvent, events: AsyncIterator[TurnEvent]):
        self._first: TurnEvent | None = first
        self._events = events
        self._finished = False

    def __aiter__(self) -> _AsyncBody:
        return self

    async def __anext__(self) -> bytes:
        if self._first is not None:
            first, self._first = self._first, None
            return encode_event(first)
        try:
            return encode_event(await anext(self._events))
        except BaseException:  # the end, or the turn was cancelled: either way it is over
            self._finished = True
            raise

    def close(self) -> None:
        if not self._finished:
            self._finished = True
            async_to_sync(self._close_events)()

    async def _close_events(self) -> None:
        await self._events.aclose()


class _SyncBody:
    """The response body under WSGI. The server calls ``close()`` when the body was sent or the
    client is gone (a write failed), which cancels the turn if it is still running."""

    def __init__(self, first: TurnEvent, stream: ThreadedStream):
        self._first: TurnEvent | None = first
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self._first is not None:
            first, self._first = self._first, None
            return encode_event(first)
        return encode_event(next(self._stream))

    def close(self) -> None:
        self._stream.close()


def _start_threaded(user, session_key, conversation_id, content):
    stream = ThreadedStream(lambda: turn_stream(user, session_key, conversation_id, content))
    try:
        first = next(stream)
    except BaseException:
        stream.close()
        raise
    return first, stream


@require_POST
async def stream_view(request, conversation_id):
    """Send a message to a conversation and stream the turn as server-sent events."""
    user = await request.auser()
    session_key = transport.caller_session_key(user, getattr(request, "session", None))
    try:
        content = _read_content(request)
        if isinstance(request, ASGIRequest):
            events = turn_stream(user, session_key, conversation_id, content)
            try:
                first = await anext(events)
            except BaseException:
                await events.aclose()
                raise
            return _event_stream_response(_AsyncBody(first, events))
        # Served by WSGI: this coroutine runs in a short-lived loop of its own, so the turn
        # gets a thread and a loop that outlive it.
        first, stream = await sync_to_async(_start_threaded, thread_sensitive=False)(
            user, session_key, conversation_id, content
        )
        return _event_stream_response(_SyncBody(first, stream))
    except TurnRefused as refusal:
        return refusal_response(refusal)
