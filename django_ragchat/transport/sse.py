"""Server-sent events: a turn streamed over a plain HTTP response, for clients without
websockets and for sites served by WSGI.

``POST <prefix>/conversations/<uuid>/stream/`` (or ``POST <prefix>/stream/`` to start a new
conversation, created only once the message is accepted) with ``{"content": "..."}`` answers
``text/event-stream``; each event of the turn (the websocket's vocabulary, docs/protocol.md)
is one SSE message::

    event: delta
    data: {"type": "delta", "text": "The ", "index": 0}

A request that cannot start a turn is answered with an HTTP error status instead of a stream,
its body the ``error`` event as JSON (404 unknown or foreign conversation, 400/413 invalid
message, 403 not yours to change, 409 turn in progress, 429 limits with ``Retry-After``).
Session authentication, so the request carries the CSRF token (``X-CSRFToken`` header); without
it the answer is 403 ``csrf_failed`` in the same JSON shape (``transport.csrf``), not the site's
CSRF failure page.

The same view serves both deployments: under ASGI the turn runs as a task on the server's
event loop; under WSGI it runs the turn in a ``ThreadedStream`` (Django would otherwise buffer an
async body whole). Either way a client that goes away stops the model and the partial answer
is saved as "incomplete". Under ASGI the server tells Django at once; a WSGI worker learns it
only when a write fails, so while the turn sends nothing (a call waiting for the user's
approval, a slow tool or model) the stream writes an SSE comment, ``KEEPALIVE``, after every
``STREAM_HEARTBEAT_SECONDS`` of silence: the first write after the client left still
succeeds (the connection is half closed), the next fails, and the turn stops within two
heartbeats. Under ASGI the comment keeps proxies from closing a quiet stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.core.handlers.asgi import ASGIRequest
from django.http import JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from django_ragchat import permissions
from django_ragchat.conf import ragchat_settings
from django_ragchat.events import PROTOCOL_VERSION, Delta, TurnEvent
from django_ragchat.transport import csrf, jsonbody
from django_ragchat.transport import turns as transport
from django_ragchat.transport.turns import TurnRefused
from django_ragchat.turn.sync_bridge import ThreadedStream

_ITEM, _ERROR, _END = "item", "error", "end"

#: What a stream writes after ``STREAM_HEARTBEAT_SECONDS`` without an event: an SSE comment,
#: which clients ignore (the widget, ``EventSource``, the SSE parsers of HTTP libraries).
KEEPALIVE = b": keep-alive\n\n"


def encode_event(event: TurnEvent) -> bytes:
    """One SSE message: ``event:`` the type, ``data:`` the event's JSON on one line."""
    data = event.to_dict()
    # json.dumps escapes newlines (and non-ASCII), so the data always fits on one line.
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def refusal_response(refusal: TurnRefused) -> JsonResponse:
    return JsonResponse(refusal.to_event().to_dict(), status=refusal.http_status, headers=refusal.http_headers())


def _body_size(request) -> int:
    """The body's length (the ASGI handler has read it all), for where to parse it; 0 for one
    too large to read, which ``_read_content`` refuses at once."""
    try:
        return len(request.body)
    except RequestDataTooBig:
        return 0


def _read_content(request) -> tuple[Any, str, Any]:
    """The ``content`` of the JSON body (validated later, with the turn), its ``client_id`` (the
    idempotency key, "" for none) and its ``profile`` (for a new conversation; checked by
    ``transport.new_conversation_options``); ``TurnRefused`` for a body that is too large or not
    a JSON object, or a bad ``client_id``."""
    too_large = TurnRefused("too_large", "The request body is too large.", 413)
    try:
        # Read even when too long (up to Django's DATA_UPLOAD_MAX_MEMORY_SIZE): a server that
        # answers before the client finished sending resets the connection, and the client
        # never reads the 413.
        body = request.body
    except RequestDataTooBig:  # over DATA_UPLOAD_MAX_MEMORY_SIZE, as the REST API refuses it
        jsonbody.drain_refused_body(request)
        raise too_large from None
    if not body:  # as the REST API words it, before the media type (a bodiless request has none)
        raise TurnRefused(jsonbody.JSONRefused.code, jsonbody.NO_BODY, 400)
    try:
        jsonbody.check_media_type(request.content_type)
    except jsonbody.UnsupportedMediaType as exc:
        raise TurnRefused(exc.code, str(exc), 415) from None
    try:
        data = jsonbody.loads(jsonbody.body_text(body, jsonbody.declared_charset(request)))
    except jsonbody.JSONRefused as exc:  # its code and words, as the REST API answers the same body
        raise TurnRefused(exc.code, str(exc), 400) from None
    if not isinstance(data, dict):
        raise TurnRefused("invalid_type", 'The body must be a JSON object: {"content": "..."}.', 400)
    return data.get("content"), transport.check_client_id(data.get("client_id")), data.get("profile")


async def turn_stream(user, session_key: str | None, conversation_id, content: Any,
                      client_id: str = "", *, new_conversation: dict[str, Any] | None = None,
                      **turn_options: Any) -> AsyncIterator[TurnEvent]:
    """The events of one turn for this caller: the conversation is opened, then the turn runs
    (``TurnRefused`` before the first event when either cannot happen).

    ``conversation_id`` ``None`` starts a new conversation (``new_conversation``: the keyword
    arguments of ``permissions.create_conversation``, e.g. its profile), created only once the
    turn is admitted (``transport.turn_events`` calls ``create``) and removed again if the turn
    ends before its ``ack``: a refused first message leaves nothing behind. A first message sent
    again with its ``client_id`` goes to the conversation its first attempt started
    (``transport.conversation_sent_with``) and is answered with that attempt's result.
    ``turn_options`` go to ``transport.turn_events`` (``stream``, ``history``).
    """
    created: list = []  # the conversation create() made, if it ran

    async def create():
        try:
            conversation = await sync_to_async(permissions.create_conversation)(
                user, session_key, **(new_conversation or {}))
        except PermissionError as exc:
            raise TurnRefused("forbidden", str(exc), 403) from None
        created.append(conversation)
        return conversation

    found = await transport.conversation_sent_with(user, session_key, client_id) if conversation_id is None else None
    if found is not None:
        target = found  # the first message sent again: its conversation answers it (a replay)
    elif conversation_id is None:
        target = create
    else:
        target, _ = await transport.open_conversation(user, conversation_id, session_key, for_sending=True,
                                                      client_id=client_id)
    accepted = False
    try:
        async with contextlib.aclosing(
            transport.turn_events(target, content, user=user, session_key=session_key, client_id=client_id,
                                  **turn_options)
        ) as events:
            async for event in events:
                accepted = True
                yield event
    finally:
        if created and not accepted:
            await sync_to_async(created[0].delete)()


def _event_stream_response(body) -> StreamingHttpResponse:
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on, don't buffer the response
    response["X-Ragchat-Protocol"] = str(PROTOCOL_VERSION)
    return response


class AsyncEventBody:
    """The response body under ASGI: the turn runs in a task of its own, events pass through a
    queue, each ``encode``d to bytes (``encode_event`` by default; events it encodes to ``b""``
    are skipped).

    The task runs outside the request's context, so its database work goes to the thread that
    serves the websockets' as well (as Channels does), not to a thread of this request's: an
    answer being written does not hold a database connection (Django's per-request thread
    keeps one until the response ends), and on SQLite concurrent answers do not queue for the
    write lock.

    Django cancels the response when the client disconnects: the turn is cancelled with it and
    saves its partial answer (the ``CancelledError`` lands in ``__anext__``, or, when Django was
    writing an event at the time, Django calls ``close()`` from a worker thread). With
    ``keepalive`` (seconds), ``KEEPALIVE`` is sent after that long without an event.
    """

    def __init__(self, make_events, encode: Callable[[TurnEvent], bytes] = encode_event, *,
                 merge_deltas: bool = False, keepalive: float | None = None):
        self._queue: asyncio.Queue = asyncio.Queue()
        self._encode = encode
        self._merge = merge_deltas
        self._keepalive = keepalive
        self._first: TurnEvent | None = None
        self._task = asyncio.get_running_loop().create_task(self._pump(make_events), context=contextvars.Context())

    async def _pump(self, make_events) -> None:
        try:
            async with contextlib.aclosing(make_events()) as events:
                async for event in events:
                    self._queue.put_nowait((_ITEM, event))
        except asyncio.CancelledError:
            raise  # stopped by the response: nobody is reading any more
        except BaseException as exc:  # noqa: BLE001  (handed to the response)
            self._queue.put_nowait((_ERROR, exc))
        else:
            self._queue.put_nowait((_END, None))

    async def first_event(self) -> TurnEvent:
        """The first event, read before the response starts (a refusal is raised here); the
        body sends it first."""
        self._first = await self.next_event()
        return self._first

    async def next_event(self, timeout: float | None = None) -> TurnEvent:
        """The next event; raises what the turn raised, ``StopAsyncIteration`` at the end,
        ``TimeoutError`` when none came within ``timeout`` seconds (the turn goes on)."""
        try:
            if timeout is None or not self._queue.empty():
                kind, value = await self._queue.get()
            else:  # only when there is a wait: a timer per event would cost every delta
                # Not ``wait_for``, which on Python 3.11 runs the ``get`` in a task of its own: an
                # event it waited for reached the body two loop iterations later, each as long as
                # the other turns' work on the loop. (3.12's ``wait_for`` is this ``timeout``.)
                async with asyncio.timeout(timeout):
                    kind, value = await self._queue.get()
        except asyncio.CancelledError:
            await self._stop()
            raise
        if kind == _ITEM:
            return value
        self._queue.put_nowait((kind, value))  # stays ended
        if kind == _ERROR:
            raise value
        raise StopAsyncIteration

    async def events(self) -> list[TurnEvent]:
        """Every remaining event (after ``first_event``'s): a whole answer's."""
        events = []
        with contextlib.suppress(StopAsyncIteration):
            while True:
                events.append(await self.next_event())
        return events

    def __aiter__(self) -> AsyncEventBody:
        return self

    def _ready(self) -> TurnEvent | None:
        try:
            kind, value = self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None
        if kind == _ITEM:
            return value
        self._queue.put_nowait((kind, value))  # the end stays last
        return None

    async def __anext__(self) -> bytes:
        while True:
            if self._first is not None:
                event, self._first = self._first, None
            else:
                try:
                    event = await self.next_event(self._keepalive)
                except TimeoutError:
                    return KEEPALIVE
            if self._merge:
                event, self._first = merge_ready_deltas(event, self._ready)
            data = self._encode(event)
            if data:
                return data

    async def _stop(self) -> None:
        if not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task])

    def close(self) -> None:
        if not self._task.done():
            async_to_sync(self._stop)()


class ThreadedEventBody:
    """The response body under WSGI: the turn runs on the process's background loop
    (``ThreadedStream``), events are ``encode``d as ``AsyncEventBody``'s. The server calls
    ``close()`` when the body was sent or the client is gone (a write failed), which cancels
    the turn if it is still running. With ``keepalive`` (seconds), ``KEEPALIVE`` is sent after
    that long without an event: the write that tells the worker its client has left."""

    def __init__(self, make_events, encode: Callable[[TurnEvent], bytes] = encode_event, *,
                 merge_deltas: bool = False, keepalive: float | None = None):
        self._stream = ThreadedStream(make_events)
        self._encode = encode
        self._merge = merge_deltas
        self._keepalive = keepalive
        self._first: TurnEvent | None = None

    def first_event(self) -> TurnEvent:
        """As ``AsyncEventBody.first_event``; blocking (call it off the event loop)."""
        try:
            self._first = next(self._stream)
        except BaseException:
            self._stream.close()
            raise
        return self._first

    def events(self) -> list[TurnEvent]:
        """Every remaining event; blocking."""
        return list(self._stream)

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        while True:
            if self._first is not None:
                event, self._first = self._first, None
            else:
                try:
                    event = self._stream.next_within(self._keepalive)
                except TimeoutError:
                    return KEEPALIVE
            if self._merge:
                event, self._first = merge_ready_deltas(event, self._stream.next_ready)
            data = self._encode(event)
            if data:
                return data

    def close(self) -> None:
        self._stream.close()


def merge_ready_deltas(event: TurnEvent, ready: Callable[[], TurnEvent | None]) -> tuple[TurnEvent, TurnEvent | None]:
    """``event`` joined with the deltas after it that are already waiting (``ready()``), and
    the first other event met (sent next). For bodies whose clients do not count pieces (the
    OpenAI chunks): the client gets the same text in fewer, larger pieces when it reads slower
    than the model writes, and nothing waits for a piece to be merged."""
    if not isinstance(event, Delta):
        return event, None
    texts = [event.text]
    while (following := ready()) is not None:
        if not isinstance(following, Delta):
            return Delta(text="".join(texts), index=event.index), following
        texts.append(following.text)
    return (Delta(text="".join(texts), index=event.index) if len(texts) > 1 else event), None


async def start_events(request, make_events, encode: Callable[[TurnEvent], bytes] = encode_event, *,
                       merge_deltas: bool = False,
                       keepalive: float | None = None) -> tuple[TurnEvent, AsyncEventBody | ThreadedEventBody]:
    """Start the events ``make_events()`` yields for this request, in the way its server needs:
    the first event (``TurnRefused`` is raised here, before any response exists) and the body
    that sends it and the rest (``events()`` instead collects them, for a whole answer).
    ``merge_deltas``: see ``merge_ready_deltas``; ``keepalive``: the seconds without an event
    after which the body sends ``KEEPALIVE`` (``None``: never; for clients that read SSE)."""
    if isinstance(request, ASGIRequest):
        body = AsyncEventBody(make_events, encode, merge_deltas=merge_deltas, keepalive=keepalive)
        return await body.first_event(), body
    # Served by WSGI: this coroutine runs in a short-lived loop of its own; the turn runs on
    # the process's background loop (ThreadedStream), which outlives it.
    threaded = ThreadedEventBody(make_events, encode, merge_deltas=merge_deltas, keepalive=keepalive)
    return await sync_to_async(threaded.first_event, thread_sensitive=False)(), threaded


async def remaining_events(body: AsyncEventBody | ThreadedEventBody) -> list[TurnEvent]:
    """The events after the first, for a response that waits for the whole answer."""
    if isinstance(body, AsyncEventBody):
        return await body.events()
    return await sync_to_async(body.events, thread_sensitive=False)()


async def release_request_connection() -> None:
    """The request's own database work (session, user) is done, but Django would keep its
    connection until the end of the stream: release it now, as Django's end-of-request
    handler would (a site with persistent connections, CONN_MAX_AGE, keeps it). The turn
    uses connections of its own."""
    await sync_to_async(transport.close_stale_connections)()


@csrf_exempt  # checked below, to answer a failure with the JSON error, as every other refusal
async def stream_view(request, conversation_id=None):
    """Send a message to a conversation and stream the turn as server-sent events. Without a
    ``conversation_id`` (``POST <prefix>/stream/``) the message starts a new conversation, with
    the body's ``profile`` if it names one; its id is in the ``ack`` event."""
    if request.method != "POST":  # the JSON error too, not require_POST's empty 405
        response = refusal_response(TurnRefused("method_not_allowed", f"{request.method} is not allowed here; "
                                                "use POST.", 405))
        response["Allow"] = "POST"
        return response
    user = await request.auser()
    if not getattr(user, "is_authenticated", False) and not ragchat_settings.ALLOW_ANONYMOUS:
        # The REST API's answer to the same caller (docs/api.md), not a 404, and before the CSRF
        # check, as there: a visitor who is not signed in has no session to forge.
        return refusal_response(TurnRefused("not_authenticated", "Sign in to chat (anonymous conversations are "
                                            "not enabled).", 403))
    reason = csrf.failure(request)  # after auser(): the session is loaded, no database work
    if reason is not None:
        return refusal_response(TurnRefused(csrf.CODE, csrf.message(reason), 403))
    session_key = transport.caller_session_key(user, getattr(request, "session", None))
    await release_request_connection()
    try:
        content, client_id, profile = await transport.parse_off_the_loop(_read_content, request, _body_size(request))
        new = None
        if conversation_id is None and profile is not None:  # a conversation keeps the profile it has
            transport.validate(content)  # first, as the websocket does: the same code for the same body
            new = await sync_to_async(transport.new_conversation_options)(user, profile)
        # A comment after every heartbeat of silence: how a WSGI worker learns its client left.
        _, body = await start_events(
            request, lambda: turn_stream(user, session_key, conversation_id, content, client_id, new_conversation=new),
            keepalive=ragchat_settings.STREAM_HEARTBEAT_SECONDS)
        return _event_stream_response(body)
    except TurnRefused as refusal:
        return refusal_response(refusal)
