"""The websocket consumer: chat over one socket, with the JSON protocol of docs/protocol.md.

The client sends ``message``, ``cancel``, ``tool_decision`` and ``ping`` frames; the server relays the events of
each turn (``transport.turn_events``, the same path as server-sent events) and answers
malformed frames with an ``error`` event, keeping the connection open.

Several workers: a socket joins one channel-layer group per conversation it opens. The worker
that runs a turn sends every event to its own socket directly and ``group_send``s it to the
conversation's group (``transport.relay``: deltas coalesced when the socket is behind, each
frame encoded once, the group sent to only while another socket is in it), so every other
socket open on that conversation receives the same events in the same order, whichever worker
process it is connected to (``channels_redis``). A ``cancel`` reaches the turn the same way.

The channel layer is optional. Without one (no ``CHANNEL_LAYERS``) the socket chats on its
own: its turns, its cancels and its own answers work; only the sharing between sockets (a
second tab watching live, a cancel from another tab) is off (``ragchat.W030`` says so). A
layer that fails (Redis down) is treated the same way while it fails: it is logged, never
lets an exception close the user's socket, and never stops a turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from importlib import import_module
from typing import Any, ClassVar

from asgiref.sync import sync_to_async
from channels.db import aclose_old_connections
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels.utils import await_many_dispatch
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.contrib.sessions.backends import db as db_sessions
from django.db import connections, router
from django.utils import timezone

from django_ragchat import permissions
from django_ragchat.events import PROTOCOL_VERSION, Accepted, Completed, Failed
from django_ragchat.exceptions import TurnInProgress
from django_ragchat.models import Conversation, Message
from django_ragchat.transport import jsonbody, relay, sessions
from django_ragchat.transport import turns as transport
from django_ragchat.transport.relay import LAYER_CALL_SECONDS, GroupRelay, TurnRelay
from django_ragchat.transport.turns import TurnRefused
from django_ragchat.turn import persistence, shutdown, stops
from django_ragchat.turn.confirmations import DecisionRefused, decide_tool_call
from django_ragchat.turn.lanes import database_lane

logger = logging.getLogger(__name__)

# Close code when the conversation named in the URL cannot be opened (4000-4999: application).
CLOSE_NOT_FOUND = 4404
# Close code when the socket's session ended (logout, expiry, flushed) since it connected.
CLOSE_SESSION_ENDED = 4401
# While a turn streams to a watching socket, its session is read again at most this often (a
# logout closes the socket at once through the channel layer; this bounds what an expired or
# deleted session still receives). Every frame from the client, and every turn's ack, reads it.
SESSION_RECHECK_SECONDS = 1.0


#: Channels' in-memory layer's calls that complete without waiting (they update its dicts):
#: ``_layer_call`` awaits them in place, with no ``wait_for`` (a task and a timer each).
_IN_PLACE = frozenset({"group_add", "group_discard"})


def _cancel_once(task: asyncio.Task) -> None:
    """Cancel a turn's task unless a cancellation is already under way (a Stop asked for
    twice, on the socket and through the database): a second one would interrupt the saving
    of the partial answer."""
    if not task.cancelling():
        task.cancel()


def group_name(conversation_id) -> str:
    """The channel-layer group of a conversation's open sockets."""
    return f"ragchat.conversation.{uuid.UUID(str(conversation_id)).hex}"


async def _stopped(accepted: Accepted) -> Completed | Failed:
    """The ``error`` event of an answer stopped before its end, for every socket on the
    conversation, with what was saved (the saved error says why: a cancel, a disconnect, the
    server shutting down). An answer saved whole before the stop reached it (the sender left
    during its final save) is ``done``, as a resend's replay says it."""
    payload = await sync_to_async(persistence.saved_payload)(accepted.assistant_message_id)
    if payload is not None and payload["status"] == Message.Status.COMPLETE:
        return Completed(message=payload)
    error = (payload or {}).get("error") or {}
    code = error.get("code", "cancelled")
    return Failed(code=code, message=error.get("message", "The answer was stopped."),
                  assistant_message=payload, retry_after=1 if code == "server_shutdown" else None)


def session_is_current(user, session) -> bool:
    """Whether the session the socket connected with still stands for the same caller: it
    still exists in the session store and, for a signed-in user, still names that user. A
    logout (which flushes the session) or an expiry makes it false."""

    key = getattr(session, "session_key", None)
    if not key:
        return not (user is not None and user.is_authenticated)  # nothing to re-check
    store = import_module(settings.SESSION_ENGINE).SessionStore(key)  # a fresh read, not the scope's copy
    data = _load_session(store)
    if data is None:  # gone from the store
        return False
    if user is not None and user.is_authenticated:
        return str(data.get(SESSION_KEY)) == str(user.pk)
    return True


def _load_session(store) -> dict | None:
    """``store.load()``, ``None`` when the session is gone (unknown, expired, a malformed key).
    Django's database engine (the default) is read with the statement its ORM query makes,
    written as SQL: that query costs ten times its statement (0.3 ms of CPU against 0.04),
    and every message frame reads the session."""
    if type(store) is not db_sessions.SessionStore:
        data = store.load()
        return None if not data and store.session_key is None else data
    if store.session_key is None:  # malformed (too short): never stored
        return None
    model = store.model
    connection = connections[router.db_for_read(model)]
    qn, meta = connection.ops.quote_name, model._meta
    expire = meta.get_field("expire_date")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {qn(meta.get_field('session_data').column)} FROM {qn(meta.db_table)} "
                       f"WHERE {qn(meta.pk.column)} = %s AND {qn(expire.column)} > %s",
                       [store.session_key, expire.get_db_prep_value(timezone.now(), connection)])
        row = cursor.fetchone()
    return None if row is None else store.decode(row[0])


class ChatConsumer(AsyncJsonWebsocketConsumer):
    """One chat socket. Routed at ``ws/ragchat/`` (messages name their conversation, or start
    one) and ``ws/ragchat/conversations/<uuid>/`` (bound to, and watching, that conversation).

    Authentication is the Django session (``AuthMiddlewareStack``). The handshake is refused
    for an anonymous caller unless ``ALLOW_ANONYMOUS`` is on and they have a session.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = None
        self.session_key: str | None = None
        self.conversation_id: str | None = None  # where a message without conversation_id goes
        self.watching: dict[str, bool] = {}  # conversation id -> may this socket send to it
        self.turns: dict[str, asyncio.Task] = {}  # conversation id -> turn run by this socket
        self.closed = False
        # Whether this socket's database work ran on the thread the process's consumers share
        # (not on a lane): then channels' cleanup of that thread's connections runs at its close.
        self.shared_thread_used = False
        self.session_checked = 0.0  # time.monotonic() of the last read of the session that found it current
        self.layer_groups: list[str] = []  # joined here, not in self.groups: see disconnect()
        self.channel_name: str | None = None  # set by __call__ when there is a channel layer

    # --- the channel layer: optional, and never fatal -----------------------------------

    async def __call__(self, scope, receive, send):
        # channels' AsyncConsumer.__call__, except that a channel layer that is missing or
        # fails leaves the socket working on its own instead of raising out of the consumer
        # (which would close the user's socket and stop the turn being written).
        self.scope = scope
        self.base_send = send
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        if self.channel_layer is not None:
            try:
                self.channel_name = await self.channel_layer.new_channel()
            except Exception:
                logger.exception("ragchat: the channel layer failed; this socket works on its own")
                self.channel_layer = None
        receivers = [receive] if self.channel_layer is None else [receive, self._receive_from_layer]
        try:
            with shutdown.open_connection():  # cancelled if a server shutdown runs out of time
                await await_many_dispatch(receivers, self.dispatch)
        except StopConsumer:
            pass
        except asyncio.CancelledError:
            if not shutdown.stopping():
                raise
            # Closed by the shutdown's watchdog: the server is going away, nothing to report.
            asyncio.current_task().uncancel()

    async def _receive_from_layer(self):
        """The next message for this socket's channel; waits out a failing layer (logged)."""
        delay = 0.5
        while True:
            try:
                return await self.channel_layer.receive(self.channel_name)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("ragchat: receiving from the channel layer failed; retrying in %.1f s", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _layer_call(self, method: str, *args) -> bool:
        """``channel_layer.<method>(*args)``, logged instead of raised; False if it did not happen.
        Bounded by ``LAYER_CALL_SECONDS``: a layer that does not answer (Redis stalled) neither
        holds the socket's handshake nor, at its end, keeps the server from shutting down."""
        if self.channel_layer is None:
            return False
        try:
            call = getattr(self.channel_layer, method)(*args)
            if type(self.channel_layer) is InMemoryChannelLayer and method in _IN_PLACE:
                await call  # a dict's update, never waiting: no task and timer of wait_for's
            else:
                await asyncio.wait_for(call, LAYER_CALL_SECONDS)
        except Exception:
            logger.exception("ragchat: channel layer %s failed", method)
            return False
        return True

    # --- connection ---------------------------------------------------------------------

    async def connect(self):
        self.user = self.scope.get("user")
        self.session_key = transport.caller_session_key(self.user, self.scope.get("session"))
        if not (self.user is not None and self.user.is_authenticated) and not self.session_key:
            await self.close()  # before accept(): the handshake is answered 403
            return
        await self.accept()
        self.session_checked = time.monotonic()  # read by the handshake's middleware just now
        key = getattr(self.scope.get("session"), "session_key", None)
        if key and await self._layer_call("group_add", sessions.session_group(key), self.channel_name):
            self.layer_groups.append(sessions.session_group(key))  # told of a logout (left in disconnect)
        bound = self.scope.get("url_route", {}).get("kwargs", {}).get("conversation_id")
        if bound is not None:
            self.shared_thread_used = True
            try:
                conversation, may_send = await transport.open_conversation(
                    self.user, bound, self.session_key, for_sending=False
                )
            except TurnRefused as refusal:
                await self.send_json(refusal.to_event().to_dict())
                await self.close(code=CLOSE_NOT_FOUND)
                # Frames the client sent before it read the refusal are still delivered: none of
                # them may start a conversation of its own (an outside user's trial).
                self.closed = True
                return
            await self._watch(conversation, may_send)
            self.conversation_id = str(conversation.pk)
        await self.send_json({"type": "ready", "protocol": PROTOCOL_VERSION,
                              "conversation_id": self.conversation_id})

    async def disconnect(self, code):
        self.closed = True
        for group in self.layer_groups:
            await self._layer_call("group_discard", group, self.channel_name)
        # Stop this socket's turns: each saves its partial answer as "incomplete" and tells the
        # conversation's other sockets.
        running = [task for task in self.turns.values() if not task.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    async def websocket_disconnect(self, message):
        """Channels' own, except that its cleanup of the database connections of the thread the
        consumers share (a thread hop) runs only when this socket's work ran there: a socket
        whose database work all ran on lanes (its messages and turns), which clean up their own,
        has none there to clean."""
        if self.shared_thread_used or self.groups:
            return await super().websocket_disconnect(message)
        await self.disconnect(message["code"])
        raise StopConsumer()

    async def dispatch(self, message):
        if message["type"] == "ragchat.events":
            # Turn events relayed through the channel layer: no database work, so the base
            # class's per-message connection cleanup (a thread hop) is skipped.
            if message["origin"] != self.channel_name:  # our own turns were sent directly
                await self._relay_from_group(message)
            return
        if message["type"] == "websocket.receive":
            # Nor for a client's frame: a message's database work runs on a lane, which cleans
            # up its own connections; the other frames' cleanup is done in receive(). A thread
            # hop saved before every message's turn.
            await self.websocket_receive(message)
            return
        if message["type"] in ("websocket.connect", "websocket.disconnect"):
            # Nor before the handshake and the close: connect() reads the database only to open
            # a bound conversation, which cleans its thread's connections first
            # (open_conversation_sync); disconnect() reads none, and websocket_disconnect cleans
            # up once after it when the socket worked on the shared thread. Up to three thread
            # hops saved on every socket.
            connect = message["type"] == "websocket.connect"
            await (self.websocket_connect if connect else self.websocket_disconnect)(message)
            return
        await super().dispatch(message)

    async def _relay_from_group(self, message: dict) -> None:
        """Another socket's turn: its frames, encoded once by the worker running it (``texts``;
        ``frames``, objects, from a worker of an earlier version)."""
        texts = message.get("texts")
        if texts is None:
            texts = [relay.encode(frame) for frame in message.get("frames", ())]
            ack = any(frame.get("type") == "ack" for frame in message.get("frames", ()))
        else:
            ack = bool(message.get("ack"))
        # A turn's first frame (its ack) is relayed only to a session checked just now; the
        # rest of a turn to one checked within SESSION_RECHECK_SECONDS.
        if not await self._session_still_open(fresh=ack):
            return
        for text in texts:
            await self._send_text(text)

    # --- the session --------------------------------------------------------------------

    async def _session_still_open(self, client_id: str | None = None, *, fresh: bool = True) -> bool:
        """Whether the socket's session still stands (``session_is_current``, read again from the
        session store unless ``fresh`` is false and it was read in the last
        ``SESSION_RECHECK_SECONDS``). When it does not, the socket is told (``session_ended``) and
        closed with 4401."""
        if self.closed:
            return False
        now = time.monotonic()
        if not fresh and now - self.session_checked < SESSION_RECHECK_SECONDS:
            return True
        self.shared_thread_used = True
        if await sync_to_async(session_is_current)(self.user, self.scope.get("session")):
            self.session_checked = now
            return True
        await self._end_session(client_id)
        return False

    async def _end_session(self, client_id: str | None = None) -> None:
        if self.closed:
            return
        await self._error("session_ended", "Your session has ended; sign in again and reconnect.", client_id)
        self.closed = True
        await self.close(code=CLOSE_SESSION_ENDED)

    async def ragchat_session_ended(self, message):
        """The session was logged out, on any worker (``sessions.close_session_sockets``)."""
        await self._end_session()

    # --- client frames ------------------------------------------------------------------

    async def receive(self, text_data=None, bytes_data=None):
        if self.closed:
            return  # refused at the handshake (an unknown conversation), or closing
        frame, client_id, problem = await transport.parse_off_the_loop(self._parse, text_data, len(text_data or ""))
        if problem is None and frame.get("type") == "message":
            return await self.on_message(frame, client_id)  # checks the session on its lane
        self.shared_thread_used = True  # the other frames' work runs on the shared thread
        await aclose_old_connections()  # channels' cleanup before a handler (skipped in dispatch)
        # Every frame, whatever it is, first checks that the socket's session still stands.
        if not await self._session_still_open(client_id):
            return
        if problem is not None:
            return await self._error(*problem, client_id)
        handler = self.frame_handlers.get(frame.get("type")) if isinstance(frame.get("type"), str) else None
        if handler is None:
            return await self._error("unknown_type", 'Unknown frame type; send "message", "cancel", '
                                     '"tool_decision" or "ping".', client_id)
        await handler(self, frame, client_id)

    @staticmethod
    def _parse(text_data) -> tuple[dict, str | None, tuple[str, str] | None]:
        """(the frame, its client_id, (code, message) of what is wrong with it or ``None``)."""
        if text_data is None:
            return {}, None, ("invalid_frame", "Send JSON in text frames.")
        if len(text_data) > transport.max_body_chars():
            return {}, None, ("too_large", f"Frames are limited to {transport.max_body_chars():,} characters.")
        try:
            frame = jsonbody.loads(text_data)
        except jsonbody.TooManyFields as exc:
            return {}, None, (exc.code, str(exc))
        except jsonbody.JSONRefused:
            return {}, None, ("parse_error", "The frame is not valid JSON.")
        if not isinstance(frame, dict):  # the code REST and server-sent events give a body that is no object
            return {}, None, ("invalid_type", 'The frame must be a JSON object with a "type".')
        client_id = frame.get("client_id")
        try:
            transport.check_client_id(client_id)  # it is stored (the idempotency key): no NUL either
        except TurnRefused as refusal:  # not echoed: it is no client_id
            return frame, None, (refusal.code, refusal.message)
        return frame, client_id, None

    async def on_message(self, frame: dict, client_id: str | None) -> None:
        """``{"type": "message", "content": ..., "conversation_id"?: ..., "profile"?: ...}``: run
        a turn.

        Without a conversation, a new one (with ``profile`` if it names one) is created only once
        the turn is admitted (a refused message creates nothing), unless ``client_id`` names a
        message this caller already sent: then that message's conversation answers the resend.
        """
        content = frame.get("content")
        try:
            # The session check and the conversation's lookup in one thread hop, on a lane's
            # thread: in a burst they do not queue behind every other socket's on the thread
            # they all share.
            async with database_lane() as lane:
                self.shared_thread_used |= not lane.on_lane
                if self.closed:
                    return
                checked = time.monotonic()
                current, conversation, new = await sync_to_async(self._open_for_message)(
                    content, frame.get("conversation_id", self.conversation_id), client_id, frame.get("profile"))
                if not current:
                    return await self._end_session(client_id)
                self.session_checked = checked
                if conversation is not None:
                    await self._watch(conversation, may_send=True)
        except TurnRefused as refusal:
            return await self._send_frame(self._frame(refusal.to_event().to_dict(), None, client_id))
        if conversation is None:
            key = f"new:{uuid.uuid4().hex}"  # re-keyed once the conversation exists
        else:
            key = str(conversation.pk)
            running = self.turns.get(key)
            if running is not None and not running.done():
                refusal = TurnRefused("turn_in_progress", TurnInProgress.default_message, 409,
                                      retry_after=TurnInProgress.RETRY_AFTER)
                return await self._send_frame(self._frame(refusal.to_event().to_dict(), key, client_id))
            self.conversation_id = key
        if self.closed:
            return  # the socket went while the conversation was looked up: no turn, nothing saved
        self.turns[key] = asyncio.create_task(self._run_turn_in_lane(conversation, content, client_id, key, new))

    def _open_for_message(self, content: Any, conversation_id, client_id: str | None,
                          profile: Any) -> tuple[bool, Conversation | None, dict[str, Any]]:
        """A message frame's checks, in their order, synchronously (one thread hop): (whether
        the socket's session still stands, the conversation it goes to, ``None`` for a new one,
        and a new one's options: its ``profile``). ``TurnRefused`` when the message cannot be
        sent."""
        transport.close_stale_connections()  # this lane's, before its first statement
        if not session_is_current(self.user, self.scope.get("session")):
            return False, None, {}
        transport.validate(content)
        if conversation_id is None and client_id:
            found = transport.sent_with(self.user, self.session_key, client_id, cleaned=True)
            conversation_id = str(found.pk) if found is not None else None
        if conversation_id is not None:  # a conversation keeps the profile it has
            return True, transport.open_conversation_sync(self.user, conversation_id, self.session_key, True,
                                                          client_id or "", cleaned=True)[0], {}
        if not (self.user is not None and self.user.is_authenticated) and not self.session_key:
            raise TurnRefused("forbidden", "Sign in to start a conversation.", 403)
        return True, None, transport.new_conversation_options(self.user, profile)

    async def on_cancel(self, frame: dict, client_id: str | None) -> None:
        """``{"type": "cancel", "conversation_id"?: ...}``: stop the turn being written there,
        on this socket or, through the group, on any other; and, through the database
        (``stops.request_stop``), one that another transport runs (server-sent events, REST)."""
        key = frame.get("conversation_id", self.conversation_id)
        if not isinstance(key, str) or key not in self.watching:
            return await self._send_frame(self._frame(TurnRefused.not_found().to_event().to_dict(), None, client_id))
        if not self.watching[key]:
            return await self._error("forbidden", "You may read this conversation but not change it.", client_id)
        task = self.turns.get(key)
        if task is not None and not task.done():
            _cancel_once(task)
            return
        # The turn runs on another socket (without a layer: none this one could reach), or on
        # another transport: asked both ways, it stops once (stops.Stoppable).
        await self._layer_call("group_send", group_name(key), {"type": "ragchat.cancel", "conversation_id": key})
        await sync_to_async(stops.request_stop)(key)

    async def on_ping(self, frame: dict, client_id: str | None) -> None:
        await self._send_frame(self._frame({"type": "pong"}, None, client_id))

    async def on_tool_decision(self, frame: dict, client_id: str | None) -> None:
        """``{"type": "tool_decision", "confirmation_id": int, "approve": bool}``: approve or
        reject a tool call that awaits the user's decision (its ``tool_call`` event's
        ``confirmation_id``), whichever socket or worker runs its turn. Answered
        ``{"type": "tool_decision", "confirmation_id", "status"}``; the turn's own events follow."""
        confirmation, approve = frame.get("confirmation_id"), frame.get("approve")
        if not isinstance(approve, bool):  # the REST API's code and words for the same body
            return await self._error("invalid", "Must be true or false.", client_id)
        if not await sync_to_async(session_is_current)(self.user, self.scope.get("session")):
            return await self._error("session_ended", "Your session has ended; sign in again and reconnect.", client_id)
        try:
            invocation = await sync_to_async(decide_tool_call)(confirmation, self.user, self.session_key, approve)
        except DecisionRefused as refusal:
            return await self._error(refusal.code, refusal.message, client_id)
        await self._send_frame(self._frame({"type": "tool_decision", "confirmation_id": confirmation,
                                            "status": str(invocation.status)},
                                           str(invocation.message.conversation_id), client_id))

    frame_handlers: ClassVar[dict] = {"message": on_message, "cancel": on_cancel, "ping": on_ping,
                                      "tool_decision": on_tool_decision}

    # --- channel-layer messages ---------------------------------------------------------

    async def ragchat_cancel(self, message):
        task = self.turns.get(message["conversation_id"])
        if task is not None and not task.done():
            _cancel_once(task)

    # --- turns --------------------------------------------------------------------------

    async def _create_conversation(self, key: str, options: dict[str, Any]) -> Conversation:
        """Create the conversation of a turn started without one (once it is admitted), with
        ``options`` (``transport.new_conversation_options``)."""
        try:
            conversation = await sync_to_async(permissions.create_conversation)(self.user, self.session_key, **options)
        except PermissionError as exc:
            raise TurnRefused("forbidden", str(exc), 403) from None
        new_key = str(conversation.pk)
        if self.turns.get(key) is asyncio.current_task():
            self.turns[new_key] = self.turns.pop(key)
        self.conversation_id = new_key
        await self._watch(conversation, may_send=True)
        return conversation

    async def _watch(self, conversation: Conversation, may_send: bool) -> None:
        key = str(conversation.pk)
        if key not in self.watching:
            group = group_name(key)
            if await self._layer_call("group_add", group, self.channel_name):
                self.layer_groups.append(group)  # left in disconnect()
        self.watching[key] = may_send

    async def _run_turn_in_lane(self, conversation: Conversation | None, content: Any, client_id: str | None,
                                key: str, new: dict[str, Any]) -> None:
        # The turn's database work on a thread of its own (one of a few), not the thread every
        # turn of the worker shares: a burst of turns then does not queue behind each other's
        # I/O waits (django_ragchat.turn.lanes).
        async with database_lane() as lane:
            self.shared_thread_used |= not lane.on_lane
            await self._run_turn(conversation, content, client_id, key, new)

    async def _run_turn(self, conversation: Conversation | None, content: Any, client_id: str | None,
                        key: str, new: dict[str, Any]) -> None:
        relayed: TurnRelay | None = None
        accepted: Accepted | None = None
        ended = False

        made: list[Conversation] = []  # the conversation create() made, if it ran

        async def create() -> Conversation:
            nonlocal key
            created = await self._create_conversation(key, new)
            made.append(created)
            key = str(created.pk)
            return created

        try:
            async with contextlib.aclosing(transport.turn_events(
                conversation if conversation is not None else create, content, user=self.user,
                session_key=self.session_key, client_id=client_id or "",
            )) as events:
                async for event in events:
                    if relayed is None:
                        relayed = TurnRelay(self._send_text,
                                            GroupRelay(self.channel_layer, group_name(key), self.channel_name))
                    if isinstance(event, (Completed, Failed)):
                        ended = True
                        self._forget(key)  # the answer is saved: the next message may start
                    if isinstance(event, Accepted):
                        accepted = event
                    # Not awaited: the relay sends while the turn goes on (coalescing deltas).
                    relayed.push(self._frame(event.to_dict(), key, client_id))
        except TurnRefused as refusal:
            await self._refuse(refusal, key, made, client_id)
        except asyncio.CancelledError:
            # A cancel frame or a disconnect: the turn saved its partial answer. This task is
            # ours and goes on to say so.
            asyncio.current_task().uncancel()
        except Exception:  # noqa: BLE001  (logged, and said to the sender)
            await self._crashed(key, client_id, accepted, made)
        finally:
            self._forget(key)
        if accepted is not None and not ended:
            relayed.push(self._frame((await _stopped(accepted)).to_dict(), key, client_id))
        if relayed is not None:
            await relayed.flush()

    async def _refuse(self, refusal: TurnRefused, key: str, made: list[Conversation], client_id: str | None) -> None:
        """Send the refusal of a turn that did not start; a conversation created for it (refused
        once it existed: a profile that cannot be built) is deleted first, so that a client that
        reads the refusal finds nothing left behind."""
        if made:
            await self._drop_created(made[0])
        known = None if key.startswith("new:") or made else key
        await self._send_frame(self._frame(refusal.to_event().to_dict(), known, client_id))

    async def _crashed(self, key: str, client_id: str | None, accepted: Accepted | None,
                       made: list[Conversation]) -> None:
        """A turn that raised (a bug): logged; before its ``ack`` the sender is told (after it,
        the turn saved and sent its own ``error``), and a conversation created for it deleted."""
        logger.exception("ragchat websocket turn in conversation %s failed", key)
        if accepted is None:
            if made:
                await self._drop_created(made[0])
            failed = Failed(code="internal_error", message="The assistant failed to answer; the error has been logged.")
            await self._send_frame(self._frame(failed.to_dict(), key, client_id))

    async def _drop_created(self, conversation: Conversation) -> None:
        """Delete the conversation this socket created for a turn refused once it existed (a
        profile that cannot be built): a refused message leaves nothing behind, and the socket's
        next message starts a new one."""
        key = str(conversation.pk)
        await sync_to_async(conversation.delete)()
        if self.conversation_id == key:
            self.conversation_id = None
        self.watching.pop(key, None)

    def _forget(self, key: str) -> None:
        if self.turns.get(key) is asyncio.current_task():
            del self.turns[key]

    # --- sending ------------------------------------------------------------------------

    @staticmethod
    def _frame(data: dict, conversation_id: str | None, client_id: str | None) -> dict:
        frame = dict(data)
        if conversation_id is not None:
            frame["conversation_id"] = conversation_id
        if client_id is not None:
            frame["client_id"] = client_id
        return frame

    async def _send_frame(self, frame: dict) -> None:
        if not self.closed:
            await self.send(text_data=relay.encode(frame))

    async def _send_text(self, text: str) -> None:
        """Send a frame already encoded (``relay.encode``). A send that fails means the client
        left before this consumer read its disconnect (uvicorn raises ``ClientDisconnected``,
        the websockets library ``InvalidState``): no server error, so one line in the log, not
        a traceback per frame (an outside probe counted three a disconnect), and the socket's
        later frames are dropped."""
        if self.closed:
            return
        try:
            await self.send(text_data=text)
        except Exception as exc:  # noqa: BLE001  (the server's own error for a client gone)
            self.closed = True
            logger.info("ragchat: a websocket's client left while a frame was sent to it (%s)", type(exc).__name__)

    async def _error(self, code: str, message: str, client_id: str | None = None) -> None:
        await self._send_frame(self._frame(Failed(code=code, message=message).to_dict(), None, client_id))


class UnknownPathConsumer(AsyncJsonWebsocketConsumer):
    """Any other path under ``ws/ragchat/`` (``ws/ragchat/nope/``), and any path at all after the
    site's routes (``routing.unrouted``): answered as an unknown conversation is, ``not_found``
    and close code 4404; unrouted, Channels' router raises and the handshake ends in a 500."""

    async def connect(self):
        await self.accept()
        await self.send_json(TurnRefused.not_found().to_event().to_dict())
        await self.close(code=CLOSE_NOT_FOUND)
