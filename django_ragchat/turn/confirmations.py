"""The user's approval of a tool call, and waiting for it.

A tool with ``requires_confirmation`` does not run when the model asks for it: the call is
saved as a ``pending`` ``ToolInvocation``, its ``tool_call`` event says
``"awaiting_confirmation"`` with the row's id, and the turn waits. The user decides through
``decide_tool_call`` (the websocket's ``tool_decision`` frame, ``POST
tool-calls/<id>/decision/`` of the REST API, the widget's buttons), which may run in any
process: the decision is written to the database (one conditional UPDATE: only a pending
call of an answer still being written can be decided, once), and reaches the waiting turn at
once when it is in the same process, else by the turn reading the row every
``POLL_SECONDS``. Nobody deciding within the profile's ``tool_confirmation_timeout`` abandons
the call, and a turn stopped meanwhile cancels it: nothing runs on silence.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from asgiref.sync import sync_to_async
from django.utils import timezone

from django_ragchat import permissions
from django_ragchat.exceptions import RagchatError
from django_ragchat.models import Message, ToolInvocation

#: How often a waiting turn reads its pending call's row (a decision made in another process).
POLL_SECONDS = 0.5

Status = ToolInvocation.Status

# Pending calls waited for in this process: invocation id -> (its loop, the future the decision resolves).
_waiting: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
_lock = threading.Lock()


class DecisionRefused(RagchatError):
    """A decision that cannot be made: ``not_found`` (404: no such call, or not the caller's
    conversation), ``forbidden`` (403: they may read it but not decide), ``not_pending`` (409:
    already decided, abandoned, or its answer has ended)."""

    def __init__(self, code: str, message: str, http_status: int):
        super().__init__(message, code=code, http_status=http_status)


def _resolve(future: asyncio.Future, status: str) -> None:
    if not future.done():
        future.set_result(status)


def _tell_waiting_turn(invocation_id: int, status: str) -> None:
    with _lock:
        entry = _waiting.get(invocation_id)
    if entry is not None:
        loop, future = entry
        loop.call_soon_threadsafe(_resolve, future, status)


#: The largest id a row can have (a 64-bit column): larger numbers name nothing, and the
#: databases refuse them in a query.
MAX_ID = 2**63 - 1


def parse_invocation_id(value: Any) -> int | None:
    """A tool call's id from a URL or a frame: a whole number that a row may have, else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)
    else:
        return None
    return number if 0 < number <= MAX_ID else None


def decide_tool_call(invocation_id: Any, user, session_key: str | None, approve: bool) -> ToolInvocation:
    """Approve or reject a pending tool call as ``user`` (or the anonymous ``session_key``):
    the owner of the conversation decides (``CONVERSATION_CHANGE_PERMISSION``), staff who may
    only read it may not. Raises ``DecisionRefused``. Synchronous (three queries)."""
    invocation_id = parse_invocation_id(invocation_id)
    if invocation_id is None:
        raise DecisionRefused("not_found", "No such tool call.", 404)
    invocation = ToolInvocation.objects.select_related("message__conversation").filter(pk=invocation_id).first()
    conversation = invocation.message.conversation if invocation is not None else None
    if conversation is None or not permissions.can_access(user, conversation, session_key):
        raise DecisionRefused("not_found", "No such tool call.", 404)
    if not permissions.can_change(user, conversation, session_key):
        raise DecisionRefused("forbidden", "You may read this conversation but not decide for it.", 403)
    invocation.status, invocation.decided_at = record_decision(invocation_id, user, approve)
    return invocation


def record_decision(invocation_id: int, user, approve: bool) -> tuple[str, Any]:
    """Write the decision on a pending call and tell its turn: ``(status, decided_at)``. No
    permission check (``decide_tool_call`` makes them; the terminal's ``ragchat_chat`` is a
    trusted context); ``DecisionRefused`` ``not_pending`` when it no longer waits. One query."""
    status = Status.APPROVED if approve else Status.REJECTED
    now = timezone.now()
    decided = ToolInvocation.objects.filter(
        pk=invocation_id, status=Status.PENDING, message__status=Message.Status.STREAMING,
    ).update(status=status, decided_by=user if user is not None and user.is_authenticated else None,
             decided_at=now, updated_at=now)
    if not decided:
        raise DecisionRefused("not_pending", "This tool call is not waiting for a decision any more "
                                             "(decided, abandoned, or its answer has ended).", 409)
    _tell_waiting_turn(invocation_id, status)
    return status, now


def _current_status(invocation_id: int) -> str | None:
    return ToolInvocation.objects.filter(pk=invocation_id).values_list("status", flat=True).first()


def _abandon(invocation_id: int) -> str:
    """Abandon the call unless it was decided meanwhile; its status either way."""
    now = timezone.now()
    if ToolInvocation.objects.filter(pk=invocation_id, status=Status.PENDING).update(
            status=Status.ABANDONED, updated_at=now):
        return Status.ABANDONED
    return _current_status(invocation_id) or Status.ABANDONED


async def wait_for_decision(invocation_id: int, timeout: float) -> str:
    """``"approved"``, ``"rejected"`` or, when nobody decided within ``timeout`` seconds,
    ``"abandoned"`` (the row says so too); ``"cancelled"`` when its answer was asked to stop
    meanwhile from another process (``stops.request_stop`` marked the row: the caller stops
    the turn). Cancelling the wait leaves the row pending: the turn's end marks it cancelled."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    with _lock:
        _waiting[invocation_id] = (loop, future)
    deadline = loop.time() + timeout
    try:
        while (remaining := deadline - loop.time()) > 0:
            try:
                return await asyncio.wait_for(asyncio.shield(future), min(POLL_SECONDS, remaining))
            except TimeoutError:
                status = await sync_to_async(_current_status)(invocation_id)
                if status in (Status.APPROVED, Status.REJECTED, Status.CANCELLED):
                    return status
        return await sync_to_async(_abandon)(invocation_id)
    finally:
        with _lock:
            _waiting.pop(invocation_id, None)
