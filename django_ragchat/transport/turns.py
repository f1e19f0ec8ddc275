"""What the streaming transports share: opening a conversation for a caller and running a turn
with the per-user limits, as one async iterator of events.

The websocket consumer (``transport.consumers``) and the server-sent events view (``transport.sse``, under
ASGI and under WSGI) all call these two functions, so they refuse the same requests with the
same codes and relay the same events of ``pipeline.stream_turn``.

A request that cannot start a turn raises ``TurnRefused`` before the first event; nothing has
been saved then. Its ``code`` is the ``error`` event's code, ``http_status`` what the HTTP
transport answers instead of a stream (see docs/protocol.md for the table).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from django_ragchat import permissions
from django_ragchat.conf import DEFAULTS, ragchat_settings
from django_ragchat.events import Accepted, Completed, Failed, TurnEvent
from django_ragchat.exceptions import InvalidMessage, ProfileUnavailable, RagchatError, SettingsInvalid, TurnInProgress
from django_ragchat.models import Conversation, Message
from django_ragchat.profiles import get_profile
from django_ragchat.turn import lanes, limits, persistence, pipeline, shutdown, start_gate
from django_ragchat.turn.context import TurnContext, components_for
from django_ragchat.turn.persistence import ConversationGone, DuplicateMessage
from django_ragchat.types import HistoryMessage

logger = logging.getLogger(__name__)


class TurnRefused(RagchatError):
    """The request cannot start a turn; nothing was saved.

    ``code`` is short and stable, ``message`` safe to show, ``retry_after`` (seconds) set for
    the limits.
    """

    def __init__(self, code: str, message: str, http_status: int, retry_after: float | None = None):
        super().__init__(message, code=code, http_status=http_status, retry_after=retry_after)

    @classmethod
    def not_found(cls) -> TurnRefused:
        # One answer for unknown, malformed and foreign ids: ids cannot be probed.
        return cls("not_found", "No such conversation.", 404)

    def to_event(self) -> Failed:
        """The ``error`` event the websocket sends for this refusal."""
        return Failed(code=self.code, message=self.message, retry_after=self.retry_after)

    def http_headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}


async def as_input_guardrails_leave(conversation: Conversation, text: str, user) -> str | None:
    """``text`` as the input guardrails of ``conversation``'s profile leave it (redacted, if one
    redacts: ``pipeline.check_input``), or ``None`` when one refuses it, or fails: for a text a
    transport would show where the conversation is listed without having asked it as a
    question (the OpenAI-compatible endpoint's first message of a request). A turn of its own,
    never saved: the guardrails' verdicts and trace entries go nowhere."""
    try:
        profile = get_profile(conversation.profile)
        turn = TurnContext(conversation=conversation, profile=profile, components=components_for(profile),
                           question=text, user=user)
        if await pipeline.check_input(turn) is not None:
            return None
    except Exception:
        logger.exception("ragchat could not check a text of conversation %s with its input guardrails",
                         conversation.pk)
        return None
    return turn.question


def caller_session_key(user, session) -> str | None:
    """The session key that identifies an anonymous caller; ``None`` for signed-in users and
    when anonymous chat is off (the same rule as the REST API's)."""
    if (user is not None and user.is_authenticated) or not ragchat_settings.ALLOW_ANONYMOUS:
        return None
    return getattr(session, "session_key", None)


def max_request_chars() -> int:
    """The largest request body or websocket frame read: room for the longest valid message
    even if every character arrives JSON-escaped (``\\uXXXX``)."""
    limit = ragchat_settings.MAX_MESSAGE_CHARS
    if ragchat_settings.problems(["MAX_MESSAGE_CHARS"]):  # read as the default allows; ``validate`` refuses it
        limit = DEFAULTS["MAX_MESSAGE_CHARS"]
    return 6 * limit + 1024


#: The largest body a websocket frame may be when Django reads HTTP bodies of any size
#: (``DATA_UPLOAD_MAX_MEMORY_SIZE = None``): Django's default.
DEFAULT_MAX_BODY = 2_621_440


def max_body_chars() -> int:
    """The largest request body or websocket frame parsed: as large as the REST API reads
    (Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``), so that one message gets the same answer on
    every transport ("too_long" for a long message, "too_large" above this). One larger than
    ``max_request_chars`` cannot be valid: it is parsed off the event loop
    (``parse_off_the_loop``)."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return max(max_request_chars(), DEFAULT_MAX_BODY if limit is None else limit)


async def parse_off_the_loop(parse: Callable[[Any], Any], data: Any, size: int) -> Any:
    """``parse(data)``: in place for a body (frame) of ``size`` a valid message can have, in a
    thread for a larger one (parsing megabytes would hold every other socket of the worker)."""
    if size <= max_request_chars():
        return parse(data)
    return await sync_to_async(parse, thread_sensitive=False)(data)


def validate(content: Any) -> str:
    """``content`` if it can be a user message; ``TurnRefused`` (400, 413 when too long) if not,
    or 500 ``settings_invalid`` when a setting every turn reads is wrong (no message can be)."""
    try:
        return pipeline.validate_user_message(content)
    except (InvalidMessage, SettingsInvalid) as exc:
        raise TurnRefused(exc.code, exc.message, exc.http_status) from None


def close_stale_connections() -> None:
    """Django's end-of-request connection cleanup, for this thread's connections: those past
    ``CONN_MAX_AGE`` or broken are closed (connections inside a transaction, such as a test's,
    are left alone). Turns run their database work on threads shared by the answers of the
    process, where no request ever ends; this runs there as each turn opens its conversation,
    as Channels' ``database_sync_to_async`` does. On a database lane that other turns are using
    at the same moment (``lanes.shared``: a burst), only a broken connection is closed: the
    others' queries keep it busy, and a turn does not pay for a new one (a SQLite file opened
    again, a pool checkout) when ``CONN_MAX_AGE`` is 0. A lane's SQLite connection is always
    kept: it holds no server resource, and opening one (the file, its PRAGMAs, the schema parsed
    again by the first query) was about 4 ms of a lone turn's time to first token."""
    on_lane = lanes.on_lane()
    shared = lanes.shared()
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block:
            continue
        # A lane's SQLite connection holds no server resource: kept, not reopened per turn.
        keep = shared or (on_lane and connection.vendor == "sqlite")
        if not keep:
            connection.close_if_unusable_or_obsolete()
        elif connection.connection is not None and connection.errors_occurred:
            if connection.is_usable():
                connection.errors_occurred = False
            else:
                connection.close()


def open_conversation_sync(user, conversation_id, session_key, for_sending: bool,
                           client_id: str = "", *, cleaned: bool = False) -> tuple[Conversation, bool]:
    """``open_conversation`` for synchronous callers (a view's preparation, off the loop).
    ``cleaned``: the caller has just run ``close_stale_connections`` (on PostgreSQL's pool with
    ``CONN_MAX_AGE`` 0 each run hands the connection back and the next statement takes one)."""
    if not cleaned:
        close_stale_connections()
    # For sending: whether a turn is pending there, read with it (persistence.with_pending, as SQL).
    queryset = persistence.PendingLookup(client_id) if for_sending else None
    try:
        conversation = permissions.get_conversation_for(user, conversation_id, session_key, queryset=queryset)
    except Conversation.DoesNotExist:
        raise TurnRefused.not_found() from None
    may_send = permissions.can_change(user, conversation, session_key)
    if for_sending and not may_send:
        raise TurnRefused("forbidden", "You may read this conversation but not send messages to it.", 403)
    return conversation, may_send


async def open_conversation(user, conversation_id, session_key: str | None, *,
                            for_sending: bool, client_id: str = "") -> tuple[Conversation, bool]:
    """The conversation if the caller may read it, and whether they may send to it.

    Raises ``TurnRefused``: ``not_found`` (404) for unknown, malformed and foreign ids alike;
    with ``for_sending``, ``forbidden`` (403) when the caller may read but not send (staff in
    someone else's conversation). With ``for_sending``, the same query reads whether a turn is
    pending there (``client_id``: the message's), so ``turn_events`` need not ask again.
    """
    return await sync_to_async(open_conversation_sync)(user, conversation_id, session_key, for_sending, client_id)


async def _cache_work(blocks: bool, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, work of the per-user limits in Django's cache: off the loop when it
    ``blocks`` (a network round trip), but not on the thread that serialises database work; in
    place when it does not (``limits.admission_blocks``, ``limits.cache_is_local``): a thread
    hop costs a turn more than a dict lookup does."""
    if not blocks:
        return function(*args)
    return await sync_to_async(function, thread_sensitive=False)(*args)


async def _limits_call(function: Callable[..., Any], *args: Any) -> Any:
    return await _cache_work(limits.admission_blocks(), function, *args)


def _admit(user, session_key: str | None) -> limits.Admission:
    """Take one of the caller's stream slots and count the turn against their rate."""
    try:
        return limits.Admission(user, session_key).take()
    except limits.LimitExceeded as exc:
        raise TurnRefused(exc.code, exc.message, 429, exc.retry_after) from None


def sent_with(user, session_key: str | None, client_id: str, *, cleaned: bool = False) -> Conversation | None:
    """``conversation_sent_with`` for synchronous callers (``cleaned``: ``open_conversation_sync``'s)."""
    if not cleaned:
        close_stale_connections()
    found = (permissions.visible_conversations(user, session_key)
             .filter(messages__client_id=client_id, messages__role=Message.Role.USER).first())
    if found is None or not permissions.can_change(user, found, session_key):
        return None
    return found


async def conversation_sent_with(user, session_key: str | None, client_id: str) -> Conversation | None:
    """The conversation of the caller's message sent with ``client_id``, or ``None``: a message
    that starts a conversation, sent again (a retry after a lost response or a reconnect), goes
    to the conversation its first attempt started, where it is answered with that attempt's
    result instead of starting a second conversation. Every transport asks this first."""
    if not client_id:
        return None
    return await sync_to_async(sent_with)(user, session_key, client_id)


def check_client_id(client_id: Any) -> str:
    """``client_id`` as stored ("" for none); ``TurnRefused`` (400 ``invalid_client_id``) when it
    is not a string of at most 100 characters."""
    if client_id is None:
        return ""
    if not isinstance(client_id, str) or len(client_id) > 100 or "\x00" in client_id:
        raise TurnRefused("invalid_client_id", '"client_id" must be a string of at most 100 characters.', 400)
    try:
        client_id.encode("utf-8")
    except UnicodeEncodeError:
        raise TurnRefused("invalid_client_id", '"client_id" contains invalid Unicode.', 400) from None
    return client_id


def new_conversation_options(user, profile: Any) -> dict[str, Any]:
    """The keyword arguments of ``permissions.create_conversation`` for a message that starts a
    conversation, from its ``profile`` field (the widget's ``profile`` option): ``{}`` for none
    (the default profile). ``TurnRefused`` (400 ``unknown_profile``) for a name that is no
    profile, one ``PROFILE_PERMISSION`` does not give the caller (said alike, as the REST API
    says it: which profiles others may use is not the caller's business), or not a string."""
    if profile is None:
        return {}
    if isinstance(profile, str) and permissions.can_use_profile(user, profile):  # False for no profile's name
        return {"profile": profile}
    message = f"There is no profile named {profile[:100]!r}." if isinstance(profile, str) else NOT_A_PROFILE_NAME
    raise TurnRefused("unknown_profile", message, 400)


#: What every transport says of a ``profile`` that is no string (``5``, ``["default"]``).
NOT_A_PROFILE_NAME = "A profile is named by a string."


def shutdown_refusal() -> TurnRefused:
    return TurnRefused("server_shutdown", "The server is restarting; send your message again in a moment.",
                       503, retry_after=1)


def _replay_payload(message_id: int) -> dict[str, Any] | None:
    return persistence.saved_payload(message_id)


async def replay(duplicate) -> AsyncIterator[TurnEvent]:
    """The events that answer a resend (``persistence.DuplicateMessage``): the first attempt's
    ``ack``, then its ``done`` or ``error``. ``TurnRefused`` (409 ``turn_in_progress``) while
    its answer is still being written: sent again later, the resend gets the result. An answer
    whose worker is gone (killed, its lease expired) is closed first ("interrupted", the text of
    its last heartbeat kept) and replayed as an ``error`` ``interrupted``."""
    duplicate = await sync_to_async(persistence.settle)(duplicate)
    user, assistant = duplicate.user_message, duplicate.assistant_message
    if assistant is None or assistant.status == assistant.Status.STREAMING:
        raise TurnRefused("turn_in_progress", "The answer to this message is still being written; "
                          "send it again (same client_id) to get it when it is done.", 409, retry_after=1)
    payload = await sync_to_async(_replay_payload)(assistant.pk)
    if payload is None:  # deleted meanwhile
        raise TurnRefused.not_found()
    yield Accepted(conversation_id=str(user.conversation_id), user_message_id=user.pk, user_seq=user.seq,
                   assistant_message_id=assistant.pk, replayed=True)
    if assistant.status == assistant.Status.COMPLETE:
        yield Completed(message=payload)
    else:
        error = payload.get("error") or {}
        yield Failed(code=error.get("code", assistant.status), message=error.get("message", ""),
                     assistant_message=payload)


async def turn_events(conversation: Conversation | Callable[[], Awaitable[Conversation]], content: Any, *,
                      user, session_key: str | None, client_id: str = "", stream: bool | None = None,
                      history: list[HistoryMessage] | None = None,
                      origin: dict[str, Any] | None = None, can_approve: bool = True) -> AsyncIterator[TurnEvent]:
    """Run one turn in ``conversation`` and yield its events (``pipeline.stream_turn``).

    ``conversation`` may be an async callable that creates it: called once the turn is
    admitted, so a refused turn creates no conversation. With a ``client_id``, ask
    ``conversation_sent_with`` first (a resend belongs to the conversation its first attempt
    started); two first sends at once with the same ``client_id`` start one conversation, the
    other is refused ``turn_in_progress`` (send it again to get the answer).

    Before the first event it may raise ``TurnRefused``: the message is invalid (400/413), the
    caller is over a limit (``rate_limited`` or ``too_many_streams``, 429 with
    ``retry_after``), another answer is being written in the conversation
    (``turn_in_progress``, 409), or the server is shutting down (``server_shutdown``, 503).
    The caller's stream slot is held (and renewed by the turn's heartbeat) until the iterator
    ends. Closing the iterator early (cancel, disconnect) stops the model and saves the partial
    answer as "incomplete".

    A resend with the ``client_id`` of a message already in the conversation yields that
    message's ``ack`` and its answer's ``done``/``error`` (``replay``); nothing is saved. A
    resend, and a message refused because another answer is being written, are answered
    before the limits are applied: neither takes a stream slot nor counts against
    ``TURNS_PER_MINUTE``. A conversation deleted during the turn ends it with ``error``
    ``conversation_deleted``; a server shutdown (SIGTERM) with ``error`` ``server_shutdown``
    and the partial answer saved.
    ``stream``, ``history``, ``origin`` and ``can_approve`` are ``pipeline.stream_turn``'s
    (``False``: the model answers whole; ``history``: the earlier messages as a stateless caller
    sent them; ``origin``: kept in the trace; ``can_approve=False``: the client cannot ask the
    user to approve a tool call).
    """

    if shutdown.stopping():
        raise shutdown_refusal()
    text = validate(content)
    first_send = None
    if callable(conversation) and client_id:
        first_send = limits.FirstSend(user, session_key, client_id)
    # In arrival order, at most STARTING_TURNS turns at once until their model is called.
    async with start_gate.passing():
        try:
            if first_send is not None:
                await _claim_first_send(first_send, user, session_key, client_id)
            elif (duplicate := await _resent(conversation, client_id)) is not None:
                async with contextlib.aclosing(replay(duplicate)) as replayed:
                    async for event in replayed:
                        yield event
                return
            options = {"stream": stream, "history": history, "origin": origin, "can_approve": can_approve}
            async with contextlib.aclosing(_admitted_turn(conversation, text, user, session_key, client_id,
                                                          first_send, options)) as events:
                async for event in events:
                    yield event
        finally:
            if first_send is not None:
                await _cache_work(not limits.cache_is_local(), first_send.release)


async def _resent(conversation: Conversation | Callable[[], Awaitable[Conversation]],
                  client_id: str) -> DuplicateMessage | None:
    """For an existing conversation: the first attempt of a resend (``client_id`` already
    used there), else ``None``; ``TurnRefused`` while another answer is being written."""
    if callable(conversation) or not persistence.pending_possible(conversation, client_id):
        return None
    try:
        await sync_to_async(persistence.check_pending)(conversation.pk, client_id)
    except DuplicateMessage as duplicate:
        return duplicate
    except (TurnInProgress, Conversation.DoesNotExist) as exc:
        raise _refusal(exc) from None
    return None


async def _claim_first_send(first_send: limits.FirstSend, user, session_key: str | None, client_id: str) -> None:
    refusal = TurnRefused("turn_in_progress", "This message is already being sent; send it again (same client_id) "
                          "to get its answer.", 409, retry_after=1)
    if not await _cache_work(not limits.cache_is_local(), first_send.claim):
        raise refusal
    if await conversation_sent_with(user, session_key, client_id) is not None:
        raise refusal  # its first attempt got through meanwhile: the resend finds it now


async def _admitted_turn(conversation, text: str, user, session_key: str | None, client_id: str,
                         first_send: limits.FirstSend | None, options: dict[str, Any]) -> AsyncIterator[TurnEvent]:
    """The turn once the message may be sent: admitted through the limits (which a resend or
    a refusal found only now, under the conversation's lock, gives back), then run
    (``options``: ``pipeline.stream_turn``'s ``stream``, ``history`` and ``origin``)."""
    slot = _HeldSlot(await _admission(conversation, user, session_key, client_id))
    try:
        with shutdown.running_turn():
            if callable(conversation):
                conversation = await conversation()
            # The sender is who asks: tools run as them.
            events = pipeline.stream_turn(conversation, text, client_id=client_id, user=user, **options)
            async with contextlib.aclosing(events):
                try:
                    first = await anext(events)
                except DuplicateMessage as duplicate:
                    await slot.refund()
                    async with contextlib.aclosing(replay(duplicate)) as replayed:
                        async for event in replayed:
                            yield event
                    return
                except (TurnInProgress, ProfileUnavailable, Conversation.DoesNotExist) as exc:
                    await slot.refund()
                    raise _refusal(exc) from None
                if first_send is not None:  # saved: a resend finds it from now on
                    await _cache_work(not limits.cache_is_local(), first_send.release)
                yield first
                async with contextlib.aclosing(_after_the_ack(events, first, slot)) as rest:
                    async for event in rest:
                        yield event
    finally:
        await slot.release()


async def _admission(conversation, user, session_key: str | None, client_id: str) -> limits.Admission:
    """``_admit`` for this turn. Refused ``too_many_streams`` in a conversation where an answer
    started since it was read (two sends at once), the refusal is that answer's, 409
    ``turn_in_progress``, as it is when the caller has slots to spare: one cause, one code."""
    try:
        return await _limits_call(_admit, user, session_key)
    except TurnRefused as refusal:
        if refusal.code == "too_many_streams" and not callable(conversation):
            try:
                await sync_to_async(persistence.check_pending)(conversation.pk, client_id)
            except (TurnInProgress, Conversation.DoesNotExist) as exc:
                raise _refusal(exc) from None
            except DuplicateMessage:
                pass  # a resend: refused as the limits say; sent again, it is answered
        raise


def _refusal(exc: Exception) -> TurnRefused:
    if isinstance(exc, (TurnInProgress, ProfileUnavailable)):
        return TurnRefused(exc.code, exc.message, exc.http_status, retry_after=exc.retry_after)
    return TurnRefused.not_found()  # deleted since it was opened


class _HeldSlot:
    """The caller's stream slot while its turn runs (the heartbeat renews it), released once."""

    def __init__(self, admission: limits.Admission):
        self.admission = admission
        self.slot = admission.slot
        self.held = True
        limits.hold(self.slot)

    async def release(self) -> None:
        limits.unhold(self.slot)
        if self.held:
            self.held = False
            await _limits_call(self.slot.release)

    async def refund(self) -> None:
        """The turn did not start: free the slot and take back the turn counted."""
        limits.unhold(self.slot)
        self.held = False
        await _limits_call(self.admission.refund)


async def _after_the_ack(events: AsyncIterator[TurnEvent], accepted: Accepted,
                         slot: _HeldSlot) -> AsyncIterator[TurnEvent]:
    """The turn's events after its ``ack``, the slot freed once the answer is saved."""
    try:
        async for event in events:
            if isinstance(event, (Completed, Failed)):
                # The answer is saved: free the slot before the client hears it, so its next
                # message is never refused for a turn that has ended.
                await slot.release()
            yield event
    except ConversationGone as exc:
        yield Failed(code=exc.code, message=exc.message)
    except asyncio.CancelledError:
        if not shutdown.stopping():
            raise
        # SIGTERM: the turn saved its partial answer ("incomplete", server_shutdown).
        asyncio.current_task().uncancel()
        payload = await sync_to_async(_replay_payload)(accepted.assistant_message_id)
        error = shutdown.SERVER_SHUTDOWN_ERROR
        yield Failed(code=error["code"], message=error["message"], assistant_message=payload, retry_after=1)
